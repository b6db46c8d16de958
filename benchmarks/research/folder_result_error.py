"""Research: a saved result of ``attnprobe extract --hf-dir DIR --layer 0`` against the folder's float64 attention
module (LLaMA or Qwen2: benchmarks/positional_bfloat16.py ``folder_truth``), the function error
(``function_error_over_lengths``) over every length 1 … 256 (four sequences each), over eleven lengths (eight each)
and over every row of length 256; and the served bfloat16 module's own, for scale:

    PYTHONPATH=src python benchmarks/research/folder_result_error.py DIR r.npz
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.io import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from positional_bfloat16 import folder_truth  # noqa: E402

ELEVEN = (1, 2, 3, 5, 9, 17, 33, 64, 100, 200, 256)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("result")
    ap.add_argument("--layer", type=int, default=0)
    args = ap.parse_args()
    truth = folder_truth(args.folder, args.layer)
    model = load_model(args.result).model
    every = function_error_over_lengths(model, truth, np.random.default_rng(5), tuple(range(1, 257)))
    eleven = function_error_over_lengths(model, truth, np.random.default_rng(6), ELEVEN, per_length=8)
    rows = function_error_over_lengths(model, truth, np.random.default_rng(7), (256,), rows=True)
    print(f"from the folder's float64 module: every length 1..256 {every:.3e}; eleven lengths {eleven:.3e}; every "
          f"row of length 256 {rows:.3e}")


if __name__ == "__main__":
    main()
