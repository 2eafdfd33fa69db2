"""A dbrq_bench server (`dbrq_bench --serve`): one JSON command per line in, one JSON reply per line
out. Shared by bench/compare.py and bench/portable_vs_native.py; imports no torch."""
import json
import os
import subprocess

# PyTorch's side of compare.py tunes glibc malloc through these; dbrq runs with glibc's defaults.
MALLOC_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


class DbrqServer:
    def __init__(self, path):
        env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
        self.p = subprocess.Popen([path, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, bufsize=1)

    def call(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"dbrq_bench exited (command {cmd})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"dbrq_bench: {reply.get('error')} (command {cmd})")
        return reply

    def close(self):
        try:
            self.p.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()
