"""Simulated data for the raw-unit regressions in this folder (seeded; rerun to regenerate):

    .venv/bin/python tests/models/make_data.py
"""

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def raw_height_weight(rng: np.random.Generator, n: int = 60) -> dict:
    height = rng.normal(170.0, 9.0, n)
    age = rng.uniform(20.0, 70.0, n)
    weight = -60.0 + 0.75 * height + 0.2 * age - 0.0005 * height * age + rng.normal(0, 6.0, n)
    return {"N": n, "height_cm": height.round(1).tolist(), "age": age.round(0).tolist(),
            "weight_kg": weight.round(1).tolist()}


def raw_income(rng: np.random.Generator, n: int = 60) -> dict:
    schooling = rng.integers(8, 21, n).astype(float)
    age = rng.uniform(22.0, 65.0, n)
    income = 4000.0 + 2500.0 * schooling + 400.0 * age + rng.normal(0, 9000.0, n)
    return {"N": n, "schooling": schooling.tolist(), "age": age.round(0).tolist(),
            "income": income.round(0).tolist()}


def kid_iq_interaction(rng: np.random.Generator, n: int = 400) -> dict:
    """The regression of issue T3-2 item 1: a child's test score on the mother's high-school
    completion (0/1), her IQ (raw, around 100) and their interaction, as in Gelman and Hill's
    kidiq example (coefficients near theirs)."""
    hs = rng.integers(0, 2, n).astype(float)
    iq = rng.normal(100.0, 15.0, n)
    score = -11.0 + 51.0 * hs + 1.1 * iq - 0.48 * hs * iq + rng.normal(0, 18.0, n)
    return {"N": n, "hs": hs.tolist(), "iq": iq.round(1).tolist(), "score": score.round(1).tolist()}


def main() -> None:
    for seed, make in enumerate((raw_height_weight, raw_income, kid_iq_interaction)):
        data = make(np.random.default_rng(seed))
        (HERE / f"{make.__name__}.data.json").write_text(json.dumps(data) + "\n")


if __name__ == "__main__":
    main()
