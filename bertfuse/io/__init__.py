"""Files and processes around a model: what every room may use, importing no other room
except kernels/ (to register the op library on an ONNX Runtime session).

    model    load / check / write ONNX models (validated, atomic, external data past 2 GB)
    onnx_in  a user's ONNX model checked before use: external data inside its folder, the
             graph (cycles, dangling inputs), limits on nodes and declared sizes
    ort      the one ONNX Runtime session maker (providers, options, op library, log level)
    safety   output-path checks, temp files that go on every exit, SIGTERM/SIGHUP handling
    stale    temp names that carry their process; a killed run's temps swept by the next one;
             scratch copies beside the output
    write_errors  a failed write (full disk, quota, read-only) as one line naming the file
    quiet    TensorFlow's and ONNX Runtime's native log lines kept off the terminal
    inputs   every random or probe input bertfuse makes (NumPy only)
    sidecars files beside a model: a text-in model's MODEL.vocab.txt
    limits   the limits on users' files (sizes, JSON depth, lines) and the bounded readers
    npz      a user's .npz: declared sizes (zip directory, .npy headers) checked before reading
    polygraphy  Polygraphy's JSON data files (run --save-inputs/--save-outputs): read, each
             .npy header checked against its bytes, never unpickled; inputs written for it
    triton_config  Triton's ModelConfig of a model, one message: export-triton's config.pbtxt
             (protobuf's text format) and serve's /v2 config (its JSON)
"""
