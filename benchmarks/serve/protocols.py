"""`bertfuse serve`'s two protocols side by side, on one deployment: POST /v1/infer (base64
int32 ids in, base64 pooled_output out: its fast form) against the Open Inference Protocol's
POST /v2/models/NAME/infer with the binary-data extension (what tritonclient.http sends with
binary_data=True, built here as bytes) and with JSON tensors.

Rows of the plan (one request shape, default b20 s64, row lengths uniform in [8, seq]):
    protocol    c=1 p50 ms    c=32 seq/s    errors
    v1/base64   ...
    v2/binary   ...
    v2/json     ...
c=1: one client, --requests sequential requests; c=32: 32 client threads (keep-alive
connections) in this process, --requests each. Every answer is checked against the first
v1 answer of the same request. The client threads share one GIL: on a small CPU host they
take cores from the server; a GPU host's numbers want --client-procs-style spreading (see
serve_load.py), which this script leaves out to stay short.

    python benchmarks/serve/protocols.py --model tiny.onnx --requests 50 --seq 32 --batch 4
    python benchmarks/serve/protocols.py --model shenma-3l_fp16.onnx      # GPU host

Writes $OUT/serve_protocols.json (--out, default $OUT or .) and prints the table.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bertfuse.io.inputs import lengths_request  # noqa: E402
from bertfuse.runtime.request_checks import model_facts, servable_model  # noqa: E402

OUTPUT = "pooled_output"
NAME = "bertfuse"
ROLES = ("input_ids", "input_mask", "segment_ids")


def v1_body(arrays: dict[str, np.ndarray]) -> tuple[str, bytes, dict]:
    t = lambda a: {"dtype": "int32", "shape": list(a.shape),  # noqa: E731
                   "data": base64.b64encode(np.ascontiguousarray(a, "<i4").tobytes()).decode()}
    body = json.dumps({**{r: t(a) for r, a in arrays.items()}, "outputs": [OUTPUT],
                       "encoding": "base64"}).encode()
    return "/v1/infer", body, {"Content-Type": "application/json"}


def v2_body(arrays: dict[str, np.ndarray], binary: bool) -> tuple[str, bytes, dict]:
    inputs, blobs = [], []
    for name, a in arrays.items():
        t = {"name": name, "shape": list(a.shape), "datatype": "INT32"}
        if binary:
            raw = np.ascontiguousarray(a, "<i4").tobytes()
            t["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            t["data"] = a.ravel().tolist()
        inputs.append(t)
    head = json.dumps({"inputs": inputs, "outputs": [
        {"name": OUTPUT, "parameters": {"binary_data": binary}}]}).encode()
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(head))
    return f"/v2/models/{NAME}/infer", head + b"".join(blobs), headers


def answer(protocol: str, status: int, data: bytes, headers: dict) -> np.ndarray:
    if status != 200:
        raise RuntimeError(f"{status} {data[:200]!r}")
    if protocol == "v1/base64":
        out = json.loads(data)["outputs"][OUTPUT]
        return np.frombuffer(base64.b64decode(out["data"]), "<f4").reshape(out["shape"])
    n = headers.get("inference-header-content-length")
    head = json.loads(data[:int(n)] if n else data)
    out = head["outputs"][0]
    if n:
        return np.frombuffer(data[int(n):], "<f4").reshape(out["shape"])
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def drive(port: int, protocol: str, request: tuple, want: np.ndarray, clients: int,
          per_client: int) -> dict:
    path, body, headers = request
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        for _ in range(per_client):
            start = time.perf_counter()
            try:
                conn.request("POST", path, body=body, headers=headers)
                r = conn.getresponse()
                got = answer(protocol, r.status, r.read(),
                             {k.lower(): v for k, v in r.getheaders()})
                ok = got.shape == want.shape and float(np.abs(got - want).max()) <= 1e-3
            except Exception:  # noqa: BLE001  (counted; the row says how many)
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            mine.append(time.perf_counter() - start)
            if not ok:
                with lock:
                    errors[0] += 1
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    rows = len(lat) * want.shape[0]
    return {"clients": clients, "requests": len(lat), "errors": errors[0],
            "p50_ms": round(float(np.median(lat)) * 1e3, 3),
            "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 3),
            "seq_per_s": round(rows / wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a fused .onnx")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--requests", type=int, default=300, help="per client (default 300)")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--ingress", default="auto", choices=("auto", "proxy", "haproxy", "direct"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    from bertfuse.serve import deploy

    facts = model_facts(servable_model(args.model))
    lengths = np.random.default_rng(0).integers(8, args.seq + 1, args.batch)
    arrays = dict(zip(ROLES, lengths_request(lengths, args.seq, facts.vocab_size or 1000)))
    arrays = {r: a for r, a in arrays.items() if r in facts.inputs}
    requests = {"v1/base64": v1_body(arrays), "v2/binary": v2_body(arrays, True),
                "v2/json": v2_body(arrays, False)}
    levels = [int(c) for c in args.concurrency.split(",")]
    port = 8000 + os.getpid() % 1000
    rows: dict[str, dict] = {}
    with deploy(args.model, port=port, name=NAME, device=args.device, ingress=args.ingress,
                outputs=[OUTPUT], max_batch=max(32, args.batch)) as served:
        want = None
        for protocol, request in requests.items():
            if want is None:  # the first v1 answer is the reference of every other
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                conn.request("POST", request[0], body=request[1], headers=request[2])
                r = conn.getresponse()
                want = answer(protocol, r.status, r.read(), {})
            for c in levels:
                drive(port, protocol, request, want, c, max(2, args.requests // 10))  # warm
                rows.setdefault(protocol, {})[f"c{c}"] = drive(port, protocol, request, want,
                                                               c, args.requests)
        result = {"model": args.model, "batch": args.batch, "seq": args.seq,
                  "device": served.device, "ingress": served.config.ingress,
                  "replicas": served.replicas, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serve_protocols.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"{result['device']}, ingress {result['ingress']} x{result['replicas']}, "
          f"b{args.batch} s{args.seq}, {args.requests} requests per client")
    print(f"{'protocol':<11} " + " ".join(f"{'c=' + str(c) + ' p50 ms':>12} {'seq/s':>9}"
                                            for c in levels) + "  errors")
    for protocol, by in rows.items():
        cells = " ".join(f"{by[f'c{c}']['p50_ms']:>12} {by[f'c{c}']['seq_per_s']:>9}"
                         for c in levels)
        print(f"{protocol:<11} {cells}  {sum(v['errors'] for v in by.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
