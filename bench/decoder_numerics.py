#!/usr/bin/python3
"""The full-size decoder LM's static int8 logits per token against PyTorch fp32 (issue 11).

Builds the benchmark's twin (bench/torch_models.py make_model("decoder_lm", seed 13): the seed the
decoder gets in bench/compare.py, norms randomized), its calibration prompts (make_inputs, seed 23),
and N evaluation prompts of the timed length; generates DECODER_NEW_TOKENS greedy tokens from each
evaluation prompt with PyTorch fp32; exports everything and runs //bench:decoder_numerics, which
quantizes dbrq's DecoderLM and compares its teacher-forced logits with the twin's.

    /usr/bin/python3 bench/decoder_numerics.py [--prompts=4] [--mapping=default|transformer] [--work=DIR]
"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--mapping", default="default")
    ap.add_argument("--work", default="/tmp/dbrq_decoder_numerics")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    torch.set_num_threads(1)
    model = tm.make_model("decoder_lm", seed=13)
    inputs = tm.make_inputs("decoder_lm", seed=23)
    g = torch.Generator().manual_seed(4242)
    vocab = tm.DECODER_FULL["vocab_size"]
    out = {k: v for k, v in inputs.items() if k == "ids_example" or k.startswith("ids_calib")}
    out["new_tokens"] = torch.tensor([tm.DECODER_NEW_TOKENS], dtype=torch.int64)
    for p in range(args.prompts):
        prompt = torch.randint(0, vocab, (1, tm.DECODER_PROMPT), generator=g, dtype=torch.int64)
        with torch.inference_mode():
            tokens, logits = model.generate(prompt[0].tolist(), tm.DECODER_NEW_TOKENS)
        out[f"eval_prompt{p}"] = prompt
        out[f"eval_tokens{p}"] = torch.tensor(tokens, dtype=torch.int64)
        out[f"eval_logits{p}"] = logits.float().contiguous()
    w = os.path.join(args.work, "decoder_lm.safetensors")
    i = os.path.join(args.work, "decoder_lm.numerics.safetensors")
    tm.write_safetensors(w, model.state_dict().items())
    tm.write_safetensors(i, out.items())
    subprocess.run(["bazel", "build", "-c", "opt", "//bench:decoder_numerics"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([os.path.join(ROOT, "bazel-bin/bench/decoder_numerics"), f"--weights={w}", f"--inputs={i}",
                    f"--mapping={args.mapping}"], check=True)


if __name__ == "__main__":
    main()
