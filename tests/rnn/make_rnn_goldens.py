#!/usr/bin/python3
"""Regenerates tests/rnn/golden/rnn.safetensors: nn.LSTM / nn.GRU cases for the dbrq layers of the
same names (runtime/nn.h), read by tests/rnn/rnn_golden_test.cc and rnn_dynamic_test.cc.

Run with Debian's interpreter (python3-torch 1.13), from anywhere:

    /usr/bin/python3 tests/rnn/make_rnn_goldens.py

Every case is a PyTorch module built under a fixed seed with PyTorch's default initialization; its
configuration is in CASES below and, identically, in the C++ tests. For case "c" the file holds:

    c.<key>          every state_dict tensor under its PyTorch name (state_dict order)
    c.input          the input (in the case's layout: batch_first, unbatched)
    c.h0, c.c0       initial states, when the case passes them
    c.lengths        per-sequence lengths (s64), for the packed cases
    c.output, c.h_n, c.c_n
                     the fp32 reference: the PyTorch module run in float64 on the same f32 values
                     (packed cases through pack_padded_sequence(enforce_sorted=False) and
                     pad_packed_sequence(total_length=T), so padded outputs are zeros)
    c.dyn_output, c.dyn_h_n, c.dyn_c_n
                     what dbrq's dynamic quantization computes, written with PyTorch's own int8
                     operators: every matrix product is torch.ops.quantized.linear_dynamic
                     (u8 activations quantized per call from their own range, no reduce_range)
                     with per-channel symmetric s8 weights (PerChannelMinMaxObserver, dbrq's
                     default_dynamic_qconfig), the input projection of all time steps in one call
                     (as PyTorch's CPU path does for unpacked input), the gate arithmetic in fp32
    c.torch_dyn_output, c.torch_dyn_h_n
                     PyTorch's quantize_dynamic of the module with per_channel_dynamic_qconfig, for
                     comparison (batched cases with biases: what PyTorch's dynamic RNNs take): it
                     quantizes activations with reduce_range (7 bits), and its packed path projects
                     the input step by step, so it is close to, not equal to, the emulation above

The script checks its emulation in fp32 against the module itself before writing anything.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.ao.quantization import PerChannelMinMaxObserver, per_channel_dynamic_qconfig
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from torch_zoo import write_safetensors  # noqa: E402

OUT_PATH = os.path.join(HERE, "golden", "rnn.safetensors")


def case(mode, input_size, hidden, layers=1, bias=True, batch_first=False, bidirectional=False, steps=5, batch=3,
         hx=False, lengths=None, unbatched=False):
    return dict(mode=mode, input_size=input_size, hidden_size=hidden, num_layers=layers, bias=bias,
                batch_first=batch_first, bidirectional=bidirectional, steps=steps, batch=batch, hx=hx,
                lengths=lengths, unbatched=unbatched)


# Keep in sync with kCases in tests/rnn/rnn_golden_test.cc.
CASES = {}
for m in ("lstm", "gru"):
    M = m.upper()
    CASES[f"{m}_1l"] = case(M, 4, 6)
    CASES[f"{m}_2l_hx"] = case(M, 5, 8, layers=2, steps=6, hx=True)
    CASES[f"{m}_2l_bf"] = case(M, 5, 8, layers=2, batch_first=True, steps=6, batch=2, hx=True)
    CASES[f"{m}_bi_2l"] = case(M, 4, 6, layers=2, bidirectional=True, steps=7, batch=2, hx=True)
    CASES[f"{m}_bi_bf_nobias"] = case(M, 4, 6, bias=False, batch_first=True, bidirectional=True)
    CASES[f"{m}_unbatched"] = case(M, 3, 5, layers=2, steps=4, hx=True, unbatched=True)
    CASES[f"{m}_packed"] = case(M, 4, 6, layers=2, batch_first=True, bidirectional=True, steps=7, batch=4, hx=True,
                                lengths=[5, 2, 7, 3])
    CASES[f"{m}_packed_sorted"] = case(M, 4, 6, steps=6, batch=3, lengths=[6, 4, 1])


def build(c):
    cls = nn.LSTM if c["mode"] == "LSTM" else nn.GRU
    return cls(c["input_size"], c["hidden_size"], num_layers=c["num_layers"], bias=c["bias"],
               batch_first=c["batch_first"], bidirectional=c["bidirectional"])


def run_module(module, c, x, hx, lengths):
    """The module on x (any dtype); packed cases through pack / pad."""
    if lengths is None:
        return module(x, hx)
    packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=c["batch_first"], enforce_sorted=False)
    out, state = module(packed, hx)
    out, _ = pad_packed_sequence(out, batch_first=c["batch_first"], total_length=c["steps"])
    return out, state


# ---- the recurrence written out, with a pluggable matrix product ------------------------------


def recurrence(c, sd, x, h0, c0, lengths, linear):
    """dbrq's algorithm (runtime/nn.cc): time-major, input projection of every step at once, per
    step only the hidden projection of the sequences still running (sorted longest first)."""
    lstm = c["mode"] == "LSTM"
    H, L, D = c["hidden_size"], c["num_layers"], 2 if c["bidirectional"] else 1
    if c["unbatched"]:
        x = x.unsqueeze(1)
        h0 = None if h0 is None else h0.unsqueeze(1)
        c0 = None if c0 is None else c0.unsqueeze(1)
    elif c["batch_first"]:
        x = x.transpose(0, 1)
    T, B = x.shape[0], x.shape[1]
    order = list(range(B))
    running = [B] * T
    if lengths is not None:
        order = sorted(range(B), key=lambda i: -lengths[i])  # stable, as std::stable_sort
        running = [sum(1 for n in lengths if n > t) for t in range(T)]
        x = x[:, order]
        h0 = None if h0 is None else h0[:, order]
        c0 = None if c0 is None else c0[:, order]
    h_n = torch.zeros(L * D, B, H)
    c_n = torch.zeros(L * D, B, H)
    for layer in range(L):
        out = torch.zeros(T, B, D * H)
        for d in range(D):
            sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
            idx = layer * D + d
            w_ih, w_hh = sd["weight_ih" + sfx], sd["weight_hh" + sfx]
            b_ih, b_hh = sd.get("bias_ih" + sfx), sd.get("bias_hh" + sfx)
            proj = linear(x, w_ih, b_ih)
            h = h0[idx] if h0 is not None else torch.zeros(B, H)
            cc = (c0[idx] if c0 is not None else torch.zeros(B, H)) if lstm else None
            for s in range(T):
                t = s if d == 0 else T - 1 - s
                n = running[t]
                gi = proj[t, :n]
                gh = linear(h[:n], w_hh, b_hh)
                if lstm:
                    g = gh + gi
                    i_, f_, g_, o_ = g[:, :H].sigmoid(), g[:, H:2 * H].sigmoid(), g[:, 2 * H:3 * H].tanh(), g[:, 3 * H:].sigmoid()
                    c_next = f_ * cc[:n] + i_ * g_
                    h_next = o_ * c_next.tanh()
                    cc = torch.cat([c_next, cc[n:]])
                else:
                    rz = (gh[:, :2 * H] + gi[:, :2 * H]).sigmoid()
                    nn_ = (gi[:, 2 * H:] + gh[:, 2 * H:] * rz[:, :H]).tanh()
                    h_next = (h[:n] - nn_) * rz[:, H:] + nn_
                out[t, :n, d * H:(d + 1) * H] = h_next
                h = torch.cat([h_next, h[n:]])
            h_n[idx] = h
            if lstm:
                c_n[idx] = cc
        x = out
    inverse = [order.index(i) for i in range(B)]
    x, h_n, c_n = x[:, inverse], h_n[:, inverse], c_n[:, inverse]
    if c["unbatched"]:
        x, h_n, c_n = x.squeeze(1), h_n.squeeze(1), c_n.squeeze(1)
    elif c["batch_first"]:
        x = x.transpose(0, 1)
    return x, h_n, (c_n if lstm else None)


def fp32_linear(x, w, b):
    return torch.nn.functional.linear(x, w, b)


class DynamicLinear:
    """torch.ops.quantized.linear_dynamic with per-channel symmetric s8 weights, packed once."""

    def __init__(self):
        self.packed = {}

    def __call__(self, x, w, b):
        key = id(w)
        if key not in self.packed:
            obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
            obs(w)
            scales, zps = obs.calculate_qparams()
            qw = torch.quantize_per_channel(w, scales.float(), zps, 0, torch.qint8)
            self.packed[key] = torch.ops.quantized.linear_prepack(qw, b)
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).contiguous(), self.packed[key], False)
        return y.reshape(*shape[:-1], y.shape[-1])


def main():
    torch.set_num_threads(1)
    torch.backends.quantized.engine = "onednn"
    tensors = []
    for seed, (name, c) in enumerate(CASES.items()):
        torch.manual_seed(100 + seed)
        module = build(c).eval()
        L, D, H, B, T = c["num_layers"], 2 if c["bidirectional"] else 1, c["hidden_size"], c["batch"], c["steps"]
        if c["unbatched"]:
            x = torch.randn(T, c["input_size"])
            state_shape = (L * D, H)
        else:
            x = torch.randn(B, T, c["input_size"]) if c["batch_first"] else torch.randn(T, B, c["input_size"])
            state_shape = (L * D, B, H)
        lstm = c["mode"] == "LSTM"
        h0 = torch.randn(*state_shape) * 0.5 if c["hx"] else None
        c0 = torch.randn(*state_shape) * 0.5 if c["hx"] and lstm else None
        hx = None if h0 is None else ((h0, c0) if lstm else h0)
        lengths = c["lengths"]
        sd = {k: v.detach() for k, v in module.state_dict().items()}

        # fp32 reference in float64.
        m64 = build(c).double().eval()
        m64.load_state_dict(module.state_dict())
        hx64 = None if hx is None else (tuple(t.double() for t in hx) if lstm else hx.double())
        with torch.no_grad():
            out, state = run_module(m64, c, x.double(), hx64, lengths)
        h_n, c_n = (state if lstm else (state, None))
        out, h_n = out.float(), h_n.float()
        c_n = None if c_n is None else c_n.float()

        # The written-out recurrence must be the module (else the dynamic emulation means nothing).
        with torch.no_grad():
            e_out, e_h, e_c = recurrence(c, sd, x, h0, c0, lengths, fp32_linear)
        for a, b, what in ((e_out, out, "output"), (e_h, h_n, "h_n")) + (((e_c, c_n, "c_n"),) if lstm else ()):
            err = (a - b).abs().max().item()
            assert err < 1e-5, f"{name}: emulated {what} differs from the module by {err}"

        with torch.no_grad():
            d_out, d_h, d_c = recurrence(c, sd, x, h0, c0, lengths, DynamicLinear())
            t_out = t_h = None
            if c["bias"] and not c["unbatched"]:  # PyTorch's dynamic RNNs need biases and a batch
                qmodel = torch.quantization.quantize_dynamic(nn.Sequential(module),
                                                             {type(module): per_channel_dynamic_qconfig})
                t_out, t_state = run_module(qmodel[0], c, x, hx, lengths)
                t_h = t_state[0] if lstm else t_state

        tensors += [(f"{name}.{k}", v) for k, v in sd.items()]
        tensors.append((f"{name}.input", x))
        if h0 is not None:
            tensors.append((f"{name}.h0", h0))
        if c0 is not None:
            tensors.append((f"{name}.c0", c0))
        if lengths is not None:
            tensors.append((f"{name}.lengths", torch.tensor(lengths, dtype=torch.int64)))
        tensors += [(f"{name}.output", out), (f"{name}.h_n", h_n)]
        if lstm:
            tensors.append((f"{name}.c_n", c_n))
        tensors += [(f"{name}.dyn_output", d_out), (f"{name}.dyn_h_n", d_h)]
        if lstm:
            tensors.append((f"{name}.dyn_c_n", d_c))
        if t_out is not None:
            tensors += [(f"{name}.torch_dyn_output", t_out), (f"{name}.torch_dyn_h_n", t_h)]

        def sqnr(a, ref):
            return 10 * torch.log10(ref.pow(2).sum() / (a - ref).pow(2).sum()).item()
        line = f"{name}: SQNR vs fp32: emulated dbrq dynamic {sqnr(d_out, out):.1f} dB"
        if t_out is not None:
            line += (f", torch quantize_dynamic {sqnr(t_out, out):.1f} dB; max |emulated - torch| "
                     f"{(d_out - t_out).abs().max().item():.2e}")
        print(line)

    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    write_safetensors(OUT_PATH, tensors, {"generator": "tests/rnn/make_rnn_goldens.py", "torch": torch.__version__,
                                          "cases": json.dumps(CASES, sort_keys=True)})
    print(f"wrote {OUT_PATH}: {os.path.getsize(OUT_PATH)} bytes, {len(CASES)} cases")


if __name__ == "__main__":
    main()
