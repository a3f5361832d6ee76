"""stanvi.batch.feeder: fits handed to Dask a few at a time, in the batch's order, each once
its model's compile and reference are done (docs/batch.md#skip-after-timeout)."""

from __future__ import annotations

from pathlib import Path

from stanvi.batch.discover import ModelCase
from stanvi.batch.feeder import FitFeeder, fit_slots
from stanvi.batch.tasks import FitSpec


class Pending:
    """A future: running until ``finish``, then its result."""

    def __init__(self, value):
        self.value, self.status = value, "pending"

    def done(self):
        return self.status == "finished"

    def result(self):
        return self.value


def test_the_feeder_keeps_the_order_skips_what_waits_and_fills_the_slots():
    cases = {name: ModelCase(name, Path(f"{name}.stan"), Path(f"{name}.json"), "json")
             for name in ("a", "b")}
    todo = [(cases[m], FitSpec(m, "trustvi", "meanfield", None, seed, {}))
            for seed in range(3) for m in ("a", "b")]
    compile_b = Pending({"status": "ok", "dim": 2})
    needs = {"a": ({"status": "ok", "dim": 1}, None), "b": (compile_b, {"status": "ok"})}
    submitted = []

    def submit(case, spec, compiled, reference):
        submitted.append((case.name, spec.seed, compiled, reference))
        return len(submitted)

    feeder = FitFeeder(todo, lambda case: needs[case.name], submit, lambda: 2)
    assert [f for f, _, _ in feeder.refill()] == [1, 2]
    # b's compile runs: a's seeds go on, in order, two at a time
    assert [(m, s) for m, s, _, _ in submitted] == [("a", 0), ("a", 1)]
    assert feeder.refill() == [] and feeder.in_flight == 2
    feeder.finished_one()
    compile_b.status = "finished"
    feeder.refill()
    # b's seed 0 comes before a's seed 2, with the compile's result, not the future
    assert submitted[2] == ("b", 0, {"status": "ok", "dim": 2}, {"status": "ok"})
    feeder.finished_one()
    feeder.finished_one()
    feeder.refill()
    assert [(m, s) for m, s, _, _ in submitted[3:]] == [("b", 1), ("a", 2)]
    assert len(feeder) == 1


def test_two_fits_per_worker_thread():
    class Client:
        def nthreads(self):
            return {"w1": 1, "w2": 3}

    class Empty:
        def nthreads(self):
            return {}

    assert fit_slots(Client()) == 8
    assert fit_slots(Empty()) == 2
