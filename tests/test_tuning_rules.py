"""Each rule of the tuner's procedure (``planner.RULES``) is consulted by the planner, and each that the sweep
says pays is shown paying on a simulated pipeline it helps (``benchmarks/tune_ablation.py``): tuned with every
rule and without that one, the two choices' rates over an epoch (the simulator's ground truth) differ by at least
5 %. A rule that stops doing anything fails here."""

from __future__ import annotations

import ast
import inspect

import pytest
from sim_pipeline import epoch_rate, tune
from sim_sweep import FULL, generate, planner_without

from lightning_loadguard.tuning import planner as planner_module
from lightning_loadguard.tuning import search as search_module
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import RULES

# A pipeline each rule helps on the sweep by far (most of them the one it helps most: benchmarks/RESULTS.md, the
# ablation table), and its tuned / best with the rule and without it there, tuned in the pipeline's first draw.
PAYS = {
    "bisect": 64,  # bursty: 0.99 -> 0.66
    "contest": 804,  # io_bound: 1.00 -> 0.42
    "cores_first": 613,  # cpu_bound: 0.98 -> 0.48
    "epoch_start": 613,  # cpu_bound: 0.98 -> 0.87
    "estimate": 637,  # cpu_bound: 0.85 -> 0.05
    "halve": 427,  # cpu_bound: 0.99 -> 0.90
    "main_process": 185,  # handover_bound: 1.00 -> 0.77
    "recheck": 874,  # bursty: 1.00 -> 0.85
    "replay_scan": 484,  # bursty: 0.99 -> 0.62
    "roomiest": 907,  # cpu_bound: 0.94 -> 0.74
    "settle": 826,  # bursty: 1.00 -> 0.91
    "start_cost": 420,  # io_bound, tune_persistent_workers=False: 0.90 -> 0.83
    "tail_depth": 484,  # bursty: 0.99 -> 0.54
    "tail_workers": 664,  # bursty: 1.00 -> 0.73
    "twice": 597,  # cpu_contended: 1.00 -> 0.57
    "unsure": 898,  # bursty: 0.99 -> 0.63
}
"""Rules not here: ``cores_bound`` changes no choice on the sweep since the simulator's drift no longer follows the
core count (it caps a window that reads a phase of many computing workers' round above what the cores make:
``test_tuning_core.py::test_no_arm_reads_faster_than_the_hosts_cores_make_its_batches``); ``deeper`` changes no
choice on the sweep (it serves a worker count walled by memory or ``max_workers``:
``test_tuning_core.py::test_bursts_get_the_depth_the_replay_asks_for``); ``no_batch_again`` moves no pipeline since a
window that made no batch is read since its iterator's start, which the sweep's windows always can be: it stays for
the windows that cannot (a setting measured again without a restart, a loader whose ``iter()`` the probe does not
see): ``test_tuning_core.py::test_a_probe_whose_window_made_no_batch_is_measured_again_not_judged_at_zero``."""


OPTIONS: dict[str, dict[str, bool]] = {"start_cost": {"tune_persistent_workers": False}}
"""Options a rule's pipeline is tuned with, where not the defaults (``start_cost`` serves workers that start anew
each epoch: with persistent workers allowed, a start that costs a share of the epoch turns them on)."""


def _consulted() -> set[str]:
    """Every rule name the planner's and its search's sources test with ``"name" in self.rules``."""
    trees = [ast.parse(inspect.getsource(module)) for module in (planner_module, search_module)]
    return {
        node.left.value
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.ops[0], ast.In | ast.NotIn)
        and isinstance(node.comparators[0], ast.Attribute)
        and node.comparators[0].attr == "rules"
    }


def test_every_rule_is_consulted_and_every_consulted_rule_is_named() -> None:
    assert _consulted() == RULES


def test_the_rules_without_a_pipeline_here_are_the_ones_said_why() -> None:
    assert RULES - set(PAYS) == {"cores_bound", "deeper", "no_batch_again"}


@pytest.mark.parametrize("rule", sorted(PAYS))
def test_each_rule_pays_on_the_pipeline_it_helps_most(rule: str) -> None:
    seed = PAYS[rule]
    pipeline = generate(seed)
    options = TuneOptions(max_workers=pipeline.max_workers, **OPTIONS.get(rule, {}))
    with_rule = tune(pipeline, options, seed=seed, planner=planner_without(FULL)).chosen
    without = tune(pipeline, options, seed=seed, planner=planner_without(rule)).chosen
    assert with_rule != without, f"{pipeline.name}: both chose {with_rule.label}"
    rate_with, rate_without = epoch_rate(pipeline, with_rule), epoch_rate(pipeline, without)
    assert rate_with >= 1.05 * rate_without, (pipeline.name, with_rule.label, rate_with, without.label, rate_without)


def test_a_planner_without_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="rule must be one of"):
        planner_without("no_such_rule")
