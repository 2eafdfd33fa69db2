"""dbrq vs PyTorch 1.13, side by side: same weights, same inputs, same thread count.

Started by bench/compare.sh (which builds the C++ side and sets PyTorch's malloc environment);
see bench/README.md. PyTorch runs in this process; dbrq runs in a `dbrq_bench --serve`
subprocess. Every comparison interleaves the two in chunks of a few iterations (alternating which
side goes first), so a burst of load from other processes hits both sides alike; each side's
result is the median of all its samples. Before each measurement it waits (a bounded time) for
other processes to leave the cores, and it records how many other tasks were runnable while it
measured ("busy"). The last line printed is one JSON object.
"""

import argparse
import copy
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

import torch_models as tm
from dbrq_server import MALLOC_ENV, DbrqServer


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def median(v):
    return statistics.median(v) if v else float("nan")


def rel_err(a, b):
    """max |a - b| / max |b|."""
    a, b = a.float().reshape(-1), b.float().reshape(-1)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def cpu_model():
    """The CPU's model name (lscpu), for the record."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return "unknown CPU"


def sqnr_db(x, ref):
    """Signal-to-quantization-noise ratio of x against ref in dB: 10 log10(sum ref^2 / sum (x - ref)^2)."""
    x, ref = x.float().reshape(-1), ref.float().reshape(-1)
    noise = float((x - ref).pow(2).sum())
    return 10 * math.log10(float(ref.pow(2).sum()) / noise) if noise > 0 else float("inf")


# ---------------------------------------------------------------------------------------------
# how busy the machine is


class BusyMonitor:
    """Samples the number of runnable tasks on the machine (/proc/stat procs_running) every 50 ms.

    `excess` is the mean number of runnable tasks beyond the benchmark's own (`own`: the threads
    it is running plus this sampler), i.e. other processes competing for the cores. The 1-minute
    load average lags by a minute; this is what the cores saw during one measurement."""

    def __init__(self):
        self.own, self.sum, self.n, self.max_seen = 1, 0.0, 0, 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def running():
        try:
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("procs_running"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _run(self):
        while True:
            r = self.running()
            with self.lock:
                self.sum += max(0, r - self.own)
                self.n += 1
            time.sleep(0.05)

    def reset(self, own):
        with self.lock:
            self.own, self.sum, self.n = own, 0.0, 0

    def excess(self):
        with self.lock:
            v = self.sum / self.n if self.n else 0.0
        self.max_seen = max(self.max_seen, v)
        return v

    def wait_quiet(self, max_s, threshold=0.5):
        """Waits (at most max_s) until other processes leave the cores mostly idle; returns seconds waited."""
        t0 = time.time()
        while time.time() - t0 < max_s:
            self.reset(own=1)
            time.sleep(0.5)
            if self.excess() <= threshold:
                break
        return time.time() - t0


# ---------------------------------------------------------------------------------------------
# the two sides


class DbrqSide:
    """One dbrq configuration; setup is cheap after the first time (models are cached)."""

    def __init__(self, server, label, **setup):
        self.server, self.label, self.setup_cmd = server, label, setup
        self.info = None

    def setup(self):
        self.info = self.server.call(cmd="setup", **self.setup_cmd)

    def chunk(self, n, warmup):
        self.server.call(cmd="setup", **self.setup_cmd)  # select this model / thread count again
        return self.server.call(cmd="time", iters=n, warmup=warmup)["samples_ms"]


class TorchSide:
    def __init__(self, label, model, x, threads):
        self.label, self.model, self.x, self.threads = label, model, x, threads

    def setup(self):
        pass

    def chunk(self, n, warmup):
        torch.set_num_threads(self.threads)
        out = []
        with torch.inference_mode():
            for _ in range(warmup):
                self.model(self.x)
            for _ in range(n):
                t0 = time.perf_counter()
                self.model(self.x)
                out.append((time.perf_counter() - t0) * 1e3)
        return out


def interleave(sides, iters, chunks, warmup, monitor, threads):
    """Median latency (ms) of every side, measured in alternating chunks."""
    monitor.reset(own=threads + 1)
    gc.disable()
    try:
        for s in sides:
            s.setup()
            s.chunk(0, warmup)
        per = max(1, math.ceil(iters / chunks))
        samples = {s.label: [] for s in sides}
        for c in range(chunks):
            for s in (sides if c % 2 == 0 else list(reversed(sides))):
                samples[s.label] += s.chunk(per, 1)
    finally:
        gc.enable()
    res = {k: median(v) for k, v in samples.items()}
    res["busy"] = monitor.excess()
    return res


def pick_fastest(torch_sides, probe_iters, keep_within=1.25):
    """A short probe of every PyTorch variant; keeps those within `keep_within` of the best."""
    if len(torch_sides) == 1:
        return torch_sides
    probe = {}
    for s in torch_sides:
        s.chunk(0, 1)
        probe[s.label] = median(s.chunk(probe_iters, 0))
    best = min(probe.values())
    kept = [s for s in torch_sides if probe[s.label] <= keep_within * best]
    log("    probe: " + ", ".join(f"{k} {v:.1f} ms" for k, v in probe.items()) +
        f" -> timing {', '.join(s.label for s in kept)}")
    return kept


# ---------------------------------------------------------------------------------------------
# the report


def json_num(v, digits):
    """Rounded, or None (JSON null) when not finite: the last line must stay valid JSON."""
    return round(v, digits) if math.isfinite(v) else None


class Report:
    def __init__(self):
        self.rows = []  # (section, name, dbrq, torch, ratio, goal, note)
        self.ratios = {}
        self.absolute = {}
        self.goals = []  # {"key", "goal", "value", "met"} in measurement order
        self.busy = {}

    def add(self, section, key, dbrq, torch_, unit, note="", goal=None, ratio_key=None, busy=0.0):
        ratio = dbrq / torch_ if torch_ else float("nan")
        key_r = ratio_key or key
        self.ratios[key_r] = json_num(ratio, 4)
        goal_s = ""
        if goal is not None:
            met = ratio <= goal  # False for NaN
            self.goals.append({"key": key_r, "goal": f"<= {goal}", "value": json_num(ratio, 4), "met": met})
            goal_s = f"<= {goal} {'ok' if met else 'MISSED'}"
        self.rows.append((section, key_r, f"{dbrq:.2f} {unit}", f"{torch_:.2f} {unit}", f"{ratio:.3f}", goal_s,
                          f"[busy {busy:.1f}] " + note))
        self.busy[key_r] = round(busy, 2)

    def add_value(self, section, key, value, unit, note="", goal=None, busy=0.0):
        self.absolute[key] = json_num(value, 3)
        goal_s = ""
        if goal is not None:
            met = value < goal
            self.goals.append({"key": key, "goal": f"< {goal}", "value": json_num(value, 3), "met": met})
            goal_s = f"< {goal} {'ok' if met else 'MISSED'}"
        self.rows.append((section, key, f"{value:.1f} {unit}", "", "", goal_s, f"[busy {busy:.1f}] " + note))
        self.busy[key] = round(busy, 2)

    def print_table(self):
        head = ("section", "benchmark (ratio = dbrq / torch)", "dbrq", "torch", "ratio", "goal", "notes")
        rows = [head] + self.rows
        w = [max(len(str(r[i])) for r in rows) for i in range(len(head) - 1)]
        for i, r in enumerate(rows):
            print("  ".join(str(c).ljust(w[j]) for j, c in enumerate(r[:-1])) + "  " + r[-1])
            if i == 0:
                print("-" * (sum(w) + 2 * len(w) + 20))


# ---------------------------------------------------------------------------------------------
# the benchmarks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a few minutes)")
    ap.add_argument("--dbrq-bench", required=True)
    ap.add_argument("--overhead-bench", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prep-threads", type=int, default=2)
    ap.add_argument("--only", default="fp32,int8,densenet,bert,decoder,gru,unet,vit,overhead,prep",
                    help="comma-separated subset of: fp32,int8,densenet,bert,decoder,gru,unet,vit,overhead,prep")
    ap.add_argument("--workdir", default=None, help="where weights and inputs go (default: a temp dir)")
    ap.add_argument("--baseline-bench", default=None,
                    help="a dbrq_bench built from another revision (bench/before_after.sh): its fp32, int8 and BERT "
                         "latencies are measured in the same interleaved chunks and reported as *_vs_before ratios")
    ap.add_argument("--baseline-overhead-bench", default=None, help="the overhead_bench of that revision")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait for other processes to leave the cores before each measurement "
                         "(default 5 quick, 30 full)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    threads = [int(t) for t in args.threads.split(",")]
    q = args.quick
    # (iterations, chunks) per measurement; probes of PyTorch variants use `probe` iterations.
    iters = {1: (12, 2) if q else (40, 4), 8: (6, 2) if q else (16, 4)}
    gen_iters = (6, 2) if q else (16, 4)  # decoder generations (PyTorch takes 0.3-2 s per generation)
    # The GRU classifier runs in milliseconds: more iterations and chunks for stable medians.
    gru_iters = {1: (60, 4) if q else (200, 8), 8: (30, 4) if q else (100, 8)}
    warmup, probe = (2, 2) if q else (3, 3)
    prep_reps = 2 if q else 5
    max_wait = args.max_wait if args.max_wait is not None else (5.0 if q else 30.0)
    monitor = BusyMonitor()
    monitor.waited = 0.0

    def quiet():
        monitor.waited += monitor.wait_quiet(max_wait)

    t_start = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="dbrq_bench_")
    work = args.workdir or tmp.name
    os.makedirs(work, exist_ok=True)
    torch.backends.quantized.engine = "onednn"
    cpu = cpu_model()
    log(f"torch {torch.__version__}, {cpu}, {os.cpu_count()} cpus, threads {threads}, workdir {work}, "
        f"{'quick' if q else 'full'} run")

    # Weights and inputs, exported once; both sides compute with exactly these.
    models, inputs, files = {}, {}, {}
    names = ["resnet18", "mobilenet_v2", "bert_encoder"] + (["decoder_lm"] if "decoder" in only else [])
    names += ["gru_classifier"] if "gru" in only else []
    names += ["unet"] if "unet" in only else []
    names += ["densenet"] if "densenet" in only else []  # last: earlier models keep their seeds
    names += ["vit"] if "vit" in only else []
    for seed, name in enumerate(names):
        models[name] = tm.make_model(name, seed=10 + seed)
        inputs[name] = tm.make_inputs(name, seed=20 + seed)
        w = os.path.join(work, f"{name}.safetensors")
        i = os.path.join(work, f"{name}.inputs.safetensors")
        tm.write_safetensors(w, models[name].state_dict().items())
        tm.write_safetensors(i, inputs[name].items())
        files[name] = {"weights": w, "inputs": i}
    ref = {}  # PyTorch fp32 outputs, the reference for the parity checks

    def reference(name, batch):
        if (name, batch) not in ref:
            prev = torch.get_num_threads()  # restored: a converted FX model must keep its thread count
            torch.set_num_threads(max(threads))
            with torch.inference_mode():
                ref[(name, batch)] = models[name](tm.timed_input(inputs[name], name, batch))
            torch.set_num_threads(prev)
        return ref[(name, batch)]

    def dbrq_output(server, side, key="output"):
        path = os.path.join(work, "dbrq_out.safetensors")
        server.call(cmd="setup", **side.setup_cmd)
        server.call(cmd="save_output", path=path)
        return tm.read_safetensors(path)[key] if key else tm.read_safetensors(path)

    report = Report()
    server = DbrqServer(args.dbrq_bench)
    base = DbrqServer(args.baseline_bench) if args.baseline_bench else None

    def before(label, **setup):
        """The same configuration on the baseline build ([] without one)."""
        return [DbrqSide(base, label, **setup)] if base is not None else []

    def report_before(section, key, res, label_now, label_before):
        if base is not None:
            report.add(section, f"{key}_vs_before", res[label_now], res[label_before], "ms",
                       "torch column = dbrq before (the baseline build), same run", busy=res["busy"])
    short = {"resnet18": "resnet18", "mobilenet_v2": "mobilenet_v2", "bert_encoder": "bert", "unet": "unet",
             "densenet": "densenet"}
    try:
        # ---- fp32 (issue 2) ------------------------------------------------------------------
        if "fp32" in only:
            configs = [(m, b) for m in ("resnet18", "mobilenet_v2") for b in (1, 8)] + [("bert_encoder", 1)]
            for name, bs in configs:
                x = tm.timed_input(inputs[name], name, bs)
                variants = tm.fp32_variants(name, models[name], x)
                script = tm.torchscript_variant(models[name], x) if name != "bert_encoder" else None
                for t in threads:
                    key = f"{short[name]}_bs{bs}_t{t}_fp32"
                    log(f"{key}")
                    quiet()
                    d = DbrqSide(server, "dbrq", model=name, mode="fp32", batch=bs, threads=t, **files[name])
                    d.setup()
                    note = ""
                    if t == threads[0]:
                        err = rel_err(dbrq_output(server, d), reference(name, bs))
                        note = f"parity rel err {err:.1e}; "
                    ts = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in variants.items()], probe)
                    extra = [TorchSide("torchscript", script, x, t)] if script is not None else []
                    n, c = iters[bs]
                    b = before("dbrq before", model=name, mode="fp32", batch=bs, threads=t, **files[name])
                    res = interleave([d] + b + ts + extra, n, c, warmup, monitor, t)
                    best = min((s.label for s in ts), key=lambda k: res[k])
                    others = ", ".join(f"{s.label} {res[s.label]:.1f}" for s in ts if s.label != best)
                    report.add("fp32", key, res["dbrq"], res[best], "ms",
                               note + f"torch eager {best}" + (f" (also {others})" if others else ""), busy=res["busy"])
                    if extra:
                        report.add("fp32", f"{key}_vs_torchscript", res["dbrq"], res["torchscript"], "ms",
                                   "torch = TorchScript frozen + optimize_for_inference", busy=res["busy"])
                    report_before("fp32", key, res, "dbrq", "dbrq before")
                del variants, script
                gc.collect()

        # ---- int8 CNNs (issue 4) -------------------------------------------------------------
        int8_models = [m for m, key in (("resnet18", "int8"), ("mobilenet_v2", "int8"), ("unet", "unet")) if key in only]
        if int8_models:
            for name in int8_models:
                calib = tm.calibration(inputs[name], name)
                for bs in (1, 8):
                    x = tm.timed_input(inputs[name], name, bs)
                    for t in threads:
                        key = f"{short[name]}_bs{bs}_t{t}_int8"
                        log(f"{key}")
                        quiet()
                        torch.set_num_threads(t)
                        t0 = time.time()
                        qm = tm.fx_int8(models[name], x, calib)  # converted per batch size and thread count
                        log(f"    torch FX prepare+calibrate+convert {time.time() - t0:.1f} s")
                        d8 = DbrqSide(server, "dbrq int8", model=name, mode="int8", batch=bs, threads=t, **files[name])
                        d32 = DbrqSide(server, "dbrq fp32", model=name, mode="fp32", batch=bs, threads=t, **files[name])
                        d8.setup()
                        note = ""
                        if t == threads[0]:
                            r = reference(name, bs)
                            with torch.inference_mode():
                                y_t = qm(x)
                            y_d = dbrq_output(server, d8)
                            note = (f"int8 vs torch fp32: SQNR dbrq {sqnr_db(y_d, r):.1f} dB, torch {sqnr_db(y_t, r):.1f} dB, "
                                    f"rel err dbrq {rel_err(y_d, r):.3f}, torch {rel_err(y_t, r):.3f}; ")
                        ts = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in tm.int8_variants(qm, x).items()],
                                          probe)
                        n, c = iters[bs]
                        b = before("dbrq before int8", model=name, mode="int8", batch=bs, threads=t, **files[name])
                        res = interleave([d8, d32] + b + ts, n, c, warmup, monitor, t)
                        best = min((s.label for s in ts), key=lambda k: res[k])
                        report.add("int8", key, res["dbrq int8"], res[best], "ms", note + f"torch {best}",
                                   goal=0.9, busy=res["busy"])
                        goal = 0.3 if (name == "resnet18" and bs == 8 and t == 1) else None
                        report.add("int8", f"{short[name]}_bs{bs}_t{t}_int8_vs_dbrq_fp32", res["dbrq int8"],
                                   res["dbrq fp32"], "ms", "torch column = dbrq fp32", goal=goal, busy=res["busy"])
                        report_before("int8", key, res, "dbrq int8", "dbrq before int8")
                        del qm, ts
                        gc.collect()

        # ---- pre-activation DenseNet-121 int8 next to ResNet-18 (issue 12) --------------------
        # Its batch norms that follow a cat (norm1, transitions, norm5) used to stay fp32, so int8
        # gained far less than on a plain conv net. Both models' int8 and fp32 run in the same
        # interleaved chunks; the goal row is (densenet int8 / fp32) / (resnet18 int8 / fp32).
        if "densenet" in only:
            name, rn = "densenet", "resnet18"
            calib = tm.calibration(inputs[name], name)
            for bs in (1, 8):
                x = tm.timed_input(inputs[name], name, bs)
                for t in threads:
                    key = f"densenet_bs{bs}_t{t}"
                    log(f"{key}_int8")
                    quiet()
                    torch.set_num_threads(t)
                    t0 = time.time()
                    qm = tm.fx_int8(models[name], x, calib)
                    log(f"    torch FX prepare+calibrate+convert {time.time() - t0:.1f} s")
                    sides = {label: DbrqSide(server, label, model=m, mode=mode, batch=bs, threads=t, **files[m])
                             for label, m, mode in (("dbrq int8", name, "int8"), ("dbrq fp32", name, "fp32"),
                                                    ("resnet18 int8", rn, "int8"), ("resnet18 fp32", rn, "fp32"))}
                    sides["dbrq int8"].setup()
                    ex = sides["dbrq int8"].info.get("executors", {})
                    note = f"dbrq executors {dict(sorted(ex.items()))}; " if ex else ""
                    if t == threads[0]:
                        r = reference(name, bs)
                        with torch.inference_mode():
                            y_t = qm(x)
                        y_d = dbrq_output(server, sides["dbrq int8"])
                        note += f"int8 vs torch fp32: SQNR dbrq {sqnr_db(y_d, r):.1f} dB, torch FX {sqnr_db(y_t, r):.1f} dB; "
                    ts = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in tm.int8_variants(qm, x).items()],
                                      probe)
                    n, c = iters[bs]
                    res = interleave(list(sides.values()) + ts, n, c, warmup, monitor, t)
                    best = min((s.label for s in ts), key=lambda k: res[k])
                    report.add("densenet", f"{key}_int8", res["dbrq int8"], res[best], "ms", note + f"torch FX {best}",
                               busy=res["busy"])
                    report.add("densenet", f"{key}_int8_vs_dbrq_fp32", res["dbrq int8"], res["dbrq fp32"], "ms",
                               "torch column = dbrq fp32", busy=res["busy"])
                    report.add("densenet", f"resnet18_bs{bs}_t{t}_int8_vs_dbrq_fp32_same_run", res["resnet18 int8"],
                               res["resnet18 fp32"], "ms", "torch column = dbrq fp32 (ResNet-18, same chunks)",
                               busy=res["busy"])
                    report.add("densenet", f"{key}_int8_fp32_ratio_vs_resnet18",
                               res["dbrq int8"] / res["dbrq fp32"], res["resnet18 int8"] / res["resnet18 fp32"],
                               "x", "dbrq = densenet int8/fp32, torch column = resnet18 int8/fp32", goal=1.2,
                               busy=res["busy"])
                    del qm, ts
                    gc.collect()

        # ---- BERT int8 (issue 4) -------------------------------------------------------------
        if "bert" in only:
            name, bs = "bert_encoder", 1
            x = tm.timed_input(inputs[name], name, bs)
            variants = tm.dynamic_int8_variants(models[name], x)
            for t in threads:
                key = f"bert_bs{bs}_t{t}"
                log(f"{key}_int8")
                quiet()
                d8 = DbrqSide(server, "dbrq int8", model=name, mode="int8", batch=bs, threads=t, **files[name])
                d32 = DbrqSide(server, "dbrq fp32", model=name, mode="fp32", batch=bs, threads=t, **files[name])
                d8.setup()
                # Issue 13: the transformer recipe (transformer_qconfig_mapping + float outputs for
                # float readers), timed and measured in the same run.
                d8t = DbrqSide(server, "dbrq int8 transformer", model=name, mode="int8", batch=bs, threads=t,
                               recipe="transformer", **files[name])
                d8t.setup()
                ex = d8.info.get("executors", {})
                n_linear = sum(isinstance(m, torch.nn.Linear) for m in models[name].modules())
                n_matmul = 2 * tm.BERT_FULL["num_layers"]  # scores = q k^T and context = probs v, per layer
                note = (f"dbrq int8 linears {ex.get('int8 linear', 0)}/{n_linear}, "
                        f"int8 matmuls {ex.get('int8 matmul', 0)}/{n_matmul}")
                if t == threads[0]:
                    r = reference(name, bs)
                    torch.set_num_threads(t)
                    with torch.inference_mode():
                        y_t = variants["dynamic"][0](x)
                    y_d = dbrq_output(server, d8)
                    y_dt = dbrq_output(server, d8t)
                    # The best static recipe: the same after bias correction (same kernels, so not
                    # timed separately; docs/encoder_accuracy.md).
                    d8b = DbrqSide(server, "dbrq int8 transformer+bc", model=name, mode="int8", batch=bs,
                                   threads=t, recipe="transformer_bc", **files[name])
                    d8b.setup()
                    y_db = dbrq_output(server, d8b)
                    note += (f"; int8 vs torch fp32: SQNR dbrq static {sqnr_db(y_d, r):.1f} dB, torch dynamic "
                             f"{sqnr_db(y_t, r):.1f} dB")
                    ext = d8t.info.get("executors", {})
                    note_t = (f"dbrq transformer recipe: SQNR {sqnr_db(y_dt, r):.2f} dB vs torch fp32, "
                              f"{sqnr_db(y_db, r):.2f} dB with bias correction (default "
                              f"{sqnr_db(y_d, r):.1f} dB, torch dynamic {sqnr_db(y_t, r):.1f} dB); int8 linears "
                              f"{ext.get('int8 linear', 0)}/{n_linear}, int8 matmuls {ext.get('int8 matmul', 0)}/"
                              f"{n_matmul}")
                else:
                    note_t = "dbrq transformer recipe"
                ts = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in variants.items()], probe)
                n, c = iters[1]
                b = before("dbrq before int8", model=name, mode="int8", batch=bs, threads=t, **files[name])
                res = interleave([d8, d32, d8t] + b + ts, n, c, warmup, monitor, t)
                best = min((s.label for s in ts), key=lambda k: res[k])
                report.add("bert", f"{key}_int8_vs_dbrq_fp32", res["dbrq int8"], res["dbrq fp32"], "ms",
                           note + "; torch column = dbrq fp32", goal=0.5, busy=res["busy"])
                report.add("bert", f"{key}_int8_transformer_vs_dbrq_fp32", res["dbrq int8 transformer"],
                           res["dbrq fp32"], "ms", note_t + "; torch column = dbrq fp32", goal=0.5, busy=res["busy"])
                report.add("bert", f"{key}_int8_transformer_vs_torch_dynamic_int8", res["dbrq int8 transformer"],
                           res[best], "ms", f"dbrq transformer recipe vs torch quantize_dynamic ({best})",
                           busy=res["busy"])
                report.add("bert", f"{key}_int8_vs_torch_dynamic_int8", res["dbrq int8"], res[best], "ms",
                           f"dbrq static int8 vs torch quantize_dynamic ({best})", busy=res["busy"])
                report_before("bert", f"{key}_int8", res, "dbrq int8", "dbrq before int8")
            del variants
            gc.collect()

        # ---- ViT classifier: dbrq static int8 vs PyTorch FX int8 (issue 12) ------------------------
        if "vit" in only:
            name = "vit"
            calib = tm.calibration(inputs[name], name)
            n_linear = sum(isinstance(m, torch.nn.Linear) for m in models[name].modules())
            n_matmul = 2 * tm.VIT_FULL["num_layers"]
            for bs in (1, 8):
                x = tm.timed_input(inputs[name], name, bs)
                fp32_vars = tm.fp32_variants(name, models[name], x)
                for t in threads:
                    key = f"vit_bs{bs}_t{t}"
                    log(key)
                    quiet()
                    torch.set_num_threads(t)
                    t0 = time.time()
                    qm = tm.fx_int8(models[name], x, calib)  # same weights, same 2x8 calibration images as dbrq
                    log(f"    torch FX prepare+calibrate+convert {time.time() - t0:.1f} s")
                    d8 = DbrqSide(server, "dbrq int8", model=name, mode="int8", batch=bs, threads=t, **files[name])
                    d32 = DbrqSide(server, "dbrq fp32", model=name, mode="fp32", batch=bs, threads=t, **files[name])
                    d8.setup()
                    ex = d8.info.get("executors", {})
                    note = (f"dbrq int8 linears {ex.get('int8 linear', 0)}/{n_linear}, "
                            f"int8 matmuls {ex.get('int8 matmul', 0)}/{n_matmul}")
                    if t == threads[0]:
                        r = reference(name, bs)
                        with torch.inference_mode():
                            y_t = qm(x)
                        y_d = dbrq_output(server, d8)
                        y_32 = dbrq_output(server, d32)
                        note += (f"; vs torch fp32: SQNR dbrq int8 {sqnr_db(y_d, r):.1f} dB, FX int8 "
                                 f"{sqnr_db(y_t, r):.1f} dB, dbrq fp32 rel err {rel_err(y_32, r):.1e}")
                    ts8 = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in tm.int8_variants(qm, x).items()],
                                       probe)
                    ts32 = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in fp32_vars.items()], probe)
                    n, c = iters[bs]
                    b = before("dbrq before int8", model=name, mode="int8", batch=bs, threads=t, **files[name])
                    res = interleave([d8, d32] + b + ts8 + ts32, n, c, warmup, monitor, t)
                    best8 = min((s.label for s in ts8), key=lambda k: res[k])
                    best32 = min((s.label for s in ts32), key=lambda k: res[k])
                    report.add("vit", f"{key}_int8", res["dbrq int8"], res[best8], "ms",
                               note + f"; torch {best8}", goal=0.9, busy=res["busy"])
                    report.add("vit", f"{key}_fp32", res["dbrq fp32"], res[best32], "ms", f"torch eager {best32}",
                               busy=res["busy"])
                    report.add("vit", f"{key}_int8_vs_dbrq_fp32", res["dbrq int8"], res["dbrq fp32"], "ms",
                               "torch column = dbrq fp32", busy=res["busy"])
                    report.add("vit", f"{key}_fx_int8_vs_torch_fp32", res[best8], res[best32], "ms",
                               f"dbrq column = FX int8 ({best8}), torch column = torch fp32 ({best32})",
                               busy=res["busy"])
                    report_before("vit", f"{key}_int8", res, "dbrq int8", "dbrq before int8")
                    del qm, ts8, ts32
                    gc.collect()
                del fp32_vars
                gc.collect()

        # ---- decoder LM generation ------------------------------------------------------------
        if "decoder" in only:
            name = "decoder_lm"
            x = tm.timed_input(inputs[name], name, 1)
            n_new = tm.DECODER_NEW_TOKENS
            fp32_v = tm.decoder_fp32_variants(models[name])
            dyn_v = tm.decoder_dynamic_int8_variants(models[name])

            def generation_note(label, tokens, logits, ref_tokens, ref_logits):
                """How a generation compares with PyTorch's fp32 one: greedy tokens agreeing before the
                first divergence (after it the inputs differ), and the logits over that prefix."""
                tokens = [int(v) for v in tokens]
                agree = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(ref_tokens))
                n = max(agree, 1)  # the first token's logits always come from the same input (the prompt)
                return (f"{label}: {agree}/{len(ref_tokens)} tokens as torch fp32, logits SQNR "
                        f"{sqnr_db(logits[:n], ref_logits[:n]):.1f} dB, rel err {rel_err(logits[:n], ref_logits[:n]):.1e} "
                        f"(first {n})")

            for t in threads:
                key = f"decoder_t{t}"
                log(f"{key} (prompt {tm.DECODER_PROMPT}, {n_new} new tokens)")
                quiet()
                setup = dict(model=name, threads=t, new_tokens=n_new, **files[name])
                d32 = DbrqSide(server, "dbrq fp32", mode="fp32", **setup)
                d8 = DbrqSide(server, "dbrq int8", mode="int8", **setup)
                d8o = DbrqSide(server, "dbrq int8 int8_outputs", mode="int8", int8_outputs=True, **setup)
                # The transformer recipe (transformer_qconfig_mapping: residual adds fp32, softmax
                # observed; float outputs for float readers), as for the encoder (issue 13).
                d8t = DbrqSide(server, "dbrq int8 transformer", mode="int8", recipe="transformer", **setup)
                for d in (d32, d8, d8o, d8t):
                    d.setup()
                ex = d8.info.get("executors", {})
                n_linear = sum(isinstance(m, torch.nn.Linear) for m in models[name].modules())
                # The prompt's row loop and the cached one-token step record their own attention matmuls
                # (4 records per layer for the model's 2); the linears are shared by both paths.
                notes = {"fp32": "", "int8": f"dbrq int8 linears {ex.get('int8 linear', 0)}/{n_linear}, int8 matmul "
                                               f"records {ex.get('int8 matmul', 0)}, fp32 ops {ex.get('fp32', 0)}"}
                if t == threads[0]:
                    torch.set_num_threads(t)
                    with torch.inference_mode():
                        ref_tokens, ref_logits = fp32_v["nn.Linear"](x)
                        dyn_tokens, dyn_logits = dyn_v["dynamic"](x)
                    out = {lbl: dbrq_output(server, d, key=None) for lbl, d in (("fp32", d32), ("int8", d8),
                                                                               ("int8_outputs", d8o),
                                                                               ("transformer", d8t))}
                    notes["fp32"] = generation_note("parity: dbrq fp32", out["fp32"]["tokens"].tolist(),
                                                    out["fp32"]["output"], ref_tokens, ref_logits) + "; "
                    notes["int8"] += ("; " + generation_note("dbrq static int8", out["int8"]["tokens"].tolist(),
                                                             out["int8"]["output"], ref_tokens, ref_logits) +
                                      "; " + generation_note("int8_outputs", out["int8_outputs"]["tokens"].tolist(),
                                                             out["int8_outputs"]["output"], ref_tokens, ref_logits) +
                                      "; " + generation_note("transformer recipe",
                                                             out["transformer"]["tokens"].tolist(),
                                                             out["transformer"]["output"], ref_tokens, ref_logits) +
                                      "; " + generation_note("torch dynamic", dyn_tokens, dyn_logits, ref_tokens,
                                                             ref_logits))
                ts32 = pick_fastest([TorchSide(k, m, x, t) for k, m in fp32_v.items()], probe)
                tsd = pick_fastest([TorchSide("torch " + k, m, x, t) for k, m in dyn_v.items()], probe)
                n, c = gen_iters
                b = before("dbrq before int8", model=name, mode="int8", threads=t, new_tokens=n_new, **files[name])
                res = interleave([d8, d8o, d8t, d32] + b + ts32 + tsd, n, c, 1, monitor, t)
                best32 = min((s.label for s in ts32), key=lambda k: res[k])
                bestd = min((s.label for s in tsd), key=lambda k: res[k])
                tok_s = lambda ms: n_new / (ms / 1e3)  # noqa: E731
                rates = (f"tokens/s: dbrq int8 {tok_s(res['dbrq int8']):.0f}, transformer recipe "
                         f"{tok_s(res['dbrq int8 transformer']):.0f}, int8_outputs "
                         f"{tok_s(res['dbrq int8 int8_outputs']):.0f}, dbrq fp32 {tok_s(res['dbrq fp32']):.0f}, "
                         f"torch fp32 {tok_s(res[best32]):.0f} ({best32}), torch dynamic {tok_s(res[bestd]):.0f} "
                         f"({bestd.replace('torch ', '')})")
                report.add("decoder", f"{key}_int8_vs_dbrq_fp32", res["dbrq int8"], res["dbrq fp32"], "ms",
                           notes["int8"] + "; " + rates + "; torch column = dbrq fp32", goal=0.5, busy=res["busy"])
                report.add("decoder", f"{key}_int8_transformer_vs_dbrq_fp32", res["dbrq int8 transformer"],
                           res["dbrq fp32"], "ms", "transformer recipe (transformer_qconfig_mapping, float outputs for "
                           "float readers); per-token logits: bench/decoder_numerics.py; torch column = dbrq fp32",
                           goal=0.5, busy=res["busy"])
                report.add("decoder", f"{key}_int8_outputs_vs_dbrq_fp32", res["dbrq int8 int8_outputs"],
                           res["dbrq fp32"], "ms", "ConvertOptions::int8_outputs (the cache stays int8 between calls; "
                           "logits u8); torch column = dbrq fp32", busy=res["busy"])
                report.add("decoder", f"{key}_fp32", res["dbrq fp32"], res[best32], "ms",
                           notes["fp32"] + f"torch eager {best32}", busy=res["busy"])
                report.add("decoder", f"{key}_int8_vs_torch_fp32", res["dbrq int8"], res[best32], "ms",
                           f"dbrq static int8 vs torch fp32 ({best32})", busy=res["busy"])
                report.add("decoder", f"{key}_int8_vs_torch_dynamic_int8", res["dbrq int8"], res[bestd], "ms",
                           f"dbrq static int8 vs torch quantize_dynamic ({bestd.replace('torch ', '')})",
                           busy=res["busy"])
                for label, k in (("dbrq int8", "dbrq_int8"), ("dbrq int8 int8_outputs", "dbrq_int8_outputs"),
                                 ("dbrq int8 transformer", "dbrq_int8_transformer"),
                                 ("dbrq fp32", "dbrq_fp32"), (best32, "torch_fp32"), (bestd, "torch_dynamic_int8")):
                    report.absolute[f"{key}_{k}_tok_per_s"] = json_num(tok_s(res[label]), 1)
                report_before("decoder", f"{key}_int8", res, "dbrq int8", "dbrq before int8")
            del fp32_v, dyn_v
            gc.collect()

        # ---- GRU classifier: fp32, dynamic and static int8 ----------------------------------
        if "gru" in only:
            name = "gru_classifier"
            torch_dyn = tm.gru_dynamic_int8(models[name])
            for bs in (1, 8):
                x = tm.timed_input(inputs[name], name, bs)
                variants = tm.fp32_variants(name, models[name], x)
                for t in threads:
                    key = f"gru_bs{bs}_t{t}"
                    log(key)
                    quiet()
                    d32 = DbrqSide(server, "dbrq fp32", model=name, mode="fp32", batch=bs, threads=t, **files[name])
                    ddyn = DbrqSide(server, "dbrq dynamic", model=name, mode="dynamic", batch=bs, threads=t,
                                    **files[name])
                    d8 = DbrqSide(server, "dbrq static", model=name, mode="int8", batch=bs, threads=t, **files[name])
                    for d in (d32, ddyn, d8):
                        d.setup()
                    note = ""
                    if t == threads[0]:
                        r = reference(name, bs)
                        torch.set_num_threads(t)
                        with torch.inference_mode():
                            y_t = torch_dyn(x)
                        y = {d.label: dbrq_output(server, d) for d in (d32, ddyn, d8)}
                        note = (f"parity rel err {rel_err(y['dbrq fp32'], r):.1e}; int8 vs torch fp32: SQNR dbrq "
                                f"dynamic {sqnr_db(y['dbrq dynamic'], r):.1f} dB, static "
                                f"{sqnr_db(y['dbrq static'], r):.1f} dB, torch quantize_dynamic {sqnr_db(y_t, r):.1f} dB; ")
                    ts = pick_fastest([TorchSide(k, m, xx, t) for k, (m, xx) in variants.items()], probe)
                    td = TorchSide("torch dynamic", torch_dyn, x, t)
                    n, c = gru_iters[bs]
                    res = interleave([d32, ddyn, d8] + ts + [td], n, c, warmup, monitor, t)
                    best = min((s.label for s in ts), key=lambda k: res[k])
                    tokens = int(tm.GruClassifier.lengths_of(x).sum())
                    report.add("gru", f"{key}_fp32", res["dbrq fp32"], res[best], "ms",
                               note + f"{tokens} tokens; torch fp32 {best}", busy=res["busy"])
                    report.add("gru", f"{key}_dynamic_int8", res["dbrq dynamic"], res["torch dynamic"], "ms",
                               "dbrq default_dynamic_qconfig_mapping vs torch quantize_dynamic", busy=res["busy"])
                    report.add("gru", f"{key}_static_int8_vs_torch_dynamic_int8", res["dbrq static"],
                               res["torch dynamic"], "ms", "dbrq default_qconfig_mapping vs torch quantize_dynamic",
                               busy=res["busy"])
                    report.add("gru", f"{key}_dynamic_int8_vs_dbrq_fp32", res["dbrq dynamic"], res["dbrq fp32"], "ms",
                               "torch column = dbrq fp32", busy=res["busy"])
                    report.add("gru", f"{key}_static_int8_vs_dbrq_fp32", res["dbrq static"], res["dbrq fp32"], "ms",
                               "torch column = dbrq fp32", busy=res["busy"])
                    report.add("gru", f"{key}_torch_dynamic_int8_vs_torch_fp32", res["torch dynamic"], res[best], "ms",
                               f"dbrq column = torch quantize_dynamic, torch column = torch fp32 {best}",
                               busy=res["busy"])
                del variants
                gc.collect()
            del torch_dyn

        # ---- prepare + calibrate + convert (issue 4) -----------------------------------------
        if "prep" in only:
            name, t = "resnet18", args.prep_threads
            log(f"resnet18_prep_calib16_convert_t{t}")
            calib, ex = tm.calibration(inputs[name], name), tm.example(inputs[name], name)
            dbrq_s, torch_s, dbrq_steps, torch_steps = [], [], [], []
            quiet()
            for r in range(-1, prep_reps):  # rep -1 warms both sides up and is dropped
                def run_torch():
                    torch.set_num_threads(t)
                    m = copy.deepcopy(models[name])  # not timed (dbrq's weight loading is not timed either)
                    steps = {}
                    t0 = time.perf_counter()
                    tm.fx_int8(m, ex, calib, copy_model=False, timings=steps)
                    torch_s.append(time.perf_counter() - t0)
                    torch_steps.append(steps)

                def run_dbrq():
                    res = server.call(cmd="prep", model=name, threads=t, reps=1, **files[name])
                    dbrq_s.append(res["total_s"][0])
                    dbrq_steps.append({k: res[k][0] for k in ("prepare_s", "calibrate_s", "convert_s")})

                for f in ((run_dbrq, run_torch) if r % 2 == 0 else (run_torch, run_dbrq)):
                    f()
                if r < 0:
                    for v in (dbrq_s, torch_s, dbrq_steps, torch_steps):
                        v.clear()
                    monitor.reset(own=t + 1)

            def split(steps):
                return "/".join(f"{median([x[k] for x in steps]):.2f}" for k in ("prepare_s", "calibrate_s", "convert_s"))

            report.add("prep", f"resnet18_prep_calib16_convert_t{t}", median(dbrq_s), median(torch_s), "s",
                       f"example 1 image + 2x8 calibration images; {prep_reps} reps each; prepare/calibrate/convert "
                       f"s: dbrq {split(dbrq_steps)}, torch {split(torch_steps)}", goal=0.5, busy=monitor.excess())
            report.absolute[f"resnet18_prep_calib16_convert_t{t}_dbrq_s"] = json_num(median(dbrq_s), 3)
            report.absolute[f"resnet18_prep_calib16_convert_t{t}_torch_s"] = json_num(median(torch_s), 3)
    finally:
        server.close()
        if base is not None:
            base.close()

    # ---- per-op interception overhead (issue 3) ----------------------------------------------
    if "overhead" in only:
        log("overhead")
        env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
        quiet()
        monitor.reset(own=2)
        out = subprocess.run([args.overhead_bench, f"--reps={300 if q else 2000}"], env=env, check=True,
                             capture_output=True, text=True).stdout
        o = json.loads(out.strip().splitlines()[-1])
        busy = monitor.excess()
        report.add_value("overhead", "convert_overhead_ns_per_op", o["convert_overhead_ns_per_op"], "ns",
                         f"{o['ops']} chained int8 adds on {o['numel']} elements (a loop: {o['int8_adds_converted']} "
                         f"int8 records): model {o['int8_model_ns_per_op']:.0f} ns/op vs direct kernels::qadd "
                         f"{o['int8_direct_ns_per_op']:.0f} ns/op", goal=100, busy=busy)
        report.add_value("overhead", "fp32_dispatch_overhead_ns_per_op", o["fp32_dispatch_overhead_ns_per_op"], "ns",
                         f"unprepared model {o['fp32_model_ns_per_op']:.0f} ns/op vs direct kernels::binary "
                         f"{o['fp32_direct_ns_per_op']:.0f} ns/op", busy=busy)
        if args.baseline_overhead_bench:
            out_b = subprocess.run([args.baseline_overhead_bench, f"--reps={300 if q else 2000}"], env=env,
                                   check=True, capture_output=True, text=True).stdout
            ob = json.loads(out_b.strip().splitlines()[-1])
            report.add("overhead", "convert_overhead_ns_per_op_vs_before", o["convert_overhead_ns_per_op"],
                       ob["convert_overhead_ns_per_op"], "ns", "torch column = dbrq before (the baseline build)",
                       busy=monitor.excess())
        report.ratios["convert_model_vs_direct_kernel_per_op"] = json_num(
            o["int8_model_ns_per_op"] / o["int8_direct_ns_per_op"], 4)
        report.ratios["fp32_model_vs_direct_kernel_per_op"] = json_num(
            o["fp32_model_ns_per_op"] / o["fp32_direct_ns_per_op"], 4)

    elapsed = time.time() - t_start
    print()
    contended = sorted(k for k, v in report.busy.items() if v > 0.5)
    print(f"dbrq vs PyTorch {torch.__version__} ({'quick' if q else 'full'} run, {elapsed:.0f} s, medians; "
          f"{cpu}, {os.cpu_count()} cpus; [busy x] = mean runnable tasks of other processes during the row's "
          f"measurement; {len(contended)} of {len(report.busy)} rows had busy > 0.5)")
    report.print_table()
    result = dict(report.ratios)
    result.update(report.absolute)
    result["goals"] = report.goals
    result["meta"] = {"mode": "quick" if q else "full", "torch": torch.__version__, "cpu": cpu, "threads": threads,
                      "elapsed_s": round(elapsed, 1), "cpus": os.cpu_count(),
                      "waited_for_quiet_s": round(monitor.waited, 1),
                      "busy_by_key": report.busy, "contended_keys": contended}
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()
