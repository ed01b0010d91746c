"""What KvikIO's `defaults.set` does with floats, bools, NumPy numbers and odd values, beside
`gpumapio.defaults.set`: the evidence behind gpumapio's conversions (python/src/defaults.rs).

Run where both are installed (the GPU machine: `bash .gpu/on-device.sh run python3
python/bench/kvikio_defaults_probe.py`); prints, per package, each case and what came of it."""
cases = [("num_threads", 4.7), ("num_threads", 4.0), ("num_threads", True), ("num_threads", False),
         ("num_threads", 0), ("num_threads", -1), ("num_threads", "4"), ("num_threads", None),
         ("task_size", 1e6), ("task_size", 1048576.0), ("task_size", True), ("task_size", 0), ("task_size", -5),
         ("gds_threshold", 2.5), ("gds_threshold", True), ("gds_threshold", 0), ("gds_threshold", -1),
         ("bounce_buffer_size", 4194304.0), ("bounce_buffer_size", True), ("bounce_buffer_size", 0),
         ("compat_mode", 1.0), ("compat_mode", 1), ("compat_mode", 2), ("compat_mode", "on"), ("compat_mode", "AUTO"), ("compat_mode", "yes"),
         ("http_max_attempts", 2.9), ("http_max_attempts", True), ("http_max_attempts", 0),
         ("http_timeout", 1.5), ("http_timeout", True), ("http_timeout", 0),
         ("http_status_codes", [500.0]), ("http_status_codes", (500, 503)), ("http_status_codes", [True]), ("http_status_codes", []),
         ("auto_direct_io_read", 1), ("auto_direct_io_read", 1.0), ("auto_direct_io_read", "yes"),
         ("auto_direct_io_write", 0), ("auto_direct_io_write", "off")]
try:
    import numpy as np

    cases += [("num_threads", np.int64(3)), ("task_size", np.float32(4096.7)),
              ("http_status_codes", [np.int16(503)])]
except ImportError:
    pass
out = {}
for mod in ("kvikio.defaults", "gpumapio.defaults"):
    try:
        d = __import__(mod, fromlist=["x"])
    except Exception as e:
        out[mod] = f"import failed: {e}"; continue
    res = []
    for name, val in cases:
        try:
            before = d.get(name)
        except Exception as e:
            res.append([name, repr(val), "get raises " + type(e).__name__ + ": " + str(e)]); continue
        try:
            with d.set(name, val):
                got = d.get(name)
            res.append([name, repr(val), "-> " + repr(got)])
        except Exception as e:
            res.append([name, repr(val), "raises " + type(e).__name__ + ": " + str(e)])
        try:
            assert d.get(name) == before
        except Exception:
            res.append([name, "", "NOT RESTORED"])
    out[mod] = res
for mod, res in out.items():
    print("==", mod)
    if isinstance(res, str): print(res); continue
    for r in res: print("  ", *r)
