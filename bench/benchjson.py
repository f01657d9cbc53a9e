"""The benchmarks' results in JSON, for bench/plot.py.

Each benchmark takes `--json FILE` and, beside the ratios it prints, records every one of them
here: the figure's name, the ratio as printed, which side is the subject and which the baseline,
whether a higher or a lower ratio is better, the issue's goal where there is one, and the seconds
behind it. The file is written once the run has finished, so a failed run leaves none behind.
"""
import json
import os
import platform
import time


class Results:
    def __init__(self, bench, path):
        self.path = path
        self.doc = {"bench": bench, "host": platform.node(), "cpus": os.cpu_count(),
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "figures": [], "notes": {}}

    def add(self, figure, ratio, *, subject, baseline, better="higher", goal=None, **seconds):
        if better not in ("higher", "lower"):
            raise ValueError(f"better must be higher or lower, not {better!r}")
        self.doc["figures"].append({"figure": figure, "ratio": round(ratio, 4), "subject": subject,
                                    "baseline": baseline, "better": better, "goal": goal,
                                    **{k: round(v, 4) for k, v in seconds.items()}})

    def note(self, key, value):
        self.doc["notes"][key] = value

    def write(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)


def add_argument(parser):
    parser.add_argument("--json", metavar="FILE", help="also write the ratios to FILE as JSON "
                        "(bench/plot.py draws them)")
