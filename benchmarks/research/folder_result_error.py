"""Research: a saved result of ``attnprobe extract --hf-dir DIR --layer 0`` against the folder's float64 attention
module (LLaMA or Qwen2: ``targets.positional_modules.folder_reference``), the function error
(``function_error_over_lengths``) over every length 1 … 256 (four sequences each), over eleven lengths (eight each)
and over every row of length 256 (``--layer`` for another layer than 0):

    PYTHONPATH=src python benchmarks/research/folder_result_error.py DIR r.npz
"""
from __future__ import annotations

import argparse

import numpy as np

from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.io import load_model
from attnprobe.targets.positional_modules import folder_reference

ELEVEN = (1, 2, 3, 5, 9, 17, 33, 64, 100, 200, 256)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("result")
    ap.add_argument("--layer", type=int, default=0)
    args = ap.parse_args()
    truth = folder_reference(args.folder, args.layer)
    model = load_model(args.result)
    model = getattr(model, "model", model)  # an every-row result: its model
    every = function_error_over_lengths(model, truth, np.random.default_rng(5), tuple(range(1, 257)))
    eleven = function_error_over_lengths(model, truth, np.random.default_rng(6), ELEVEN, per_length=8)
    rows = function_error_over_lengths(model, truth, np.random.default_rng(7), (256,), rows=True)
    print(f"from the folder's float64 module: every length 1..256 {every:.3e}; eleven lengths {eleven:.3e}; every "
          f"row of length 256 {rows:.3e}")


if __name__ == "__main__":
    main()
