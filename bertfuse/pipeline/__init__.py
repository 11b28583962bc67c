"""The conversion pipeline: convert / optimize / verify as one plan of stages.

    options   every option once: name, type, default, choices, check, help (the CLI, the
              Python API and the JSON report read it)
    stages    convert:  load TF -> tf2onnx -.
              optimize: load ONNX ----------+-> passes -> check -> [parity vs TF]
                                               -> [lowering] -> [packing] -> gate -> write
              (optimize: parity vs the model as given, in ONNX Runtime)
              verify:   load ONNX + TF -> parity vs TF
    parity    the model against TensorFlow on random padded inputs (+ mask checks: mask)
    onnx_parity  optimize's: the fused model against the model as given (ONNX Runtime, CPU);
              its load, an Erfc rewritten as 1 - Erf (passes/erfc.py)
    lowering  --ops bertfuse: the checked contrib form rewritten into ai.bertfuse ops,
              checked equal to it with the NumPy references (+ FP8 weights: fp8)
    gate      --strict, the parity verdict, then the atomic write
    report    the run report: stages, passes, parity, options, tool versions

Imports run down: stages -> options, parity, lowering, gate, report -> converter/, passes/,
ops/, io/; nothing here imports cli/ or the package face.
"""
