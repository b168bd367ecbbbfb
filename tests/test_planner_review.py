"""The planner review's findings (issue 35, item 7), each a test that failed before its fix.

One-node local SGD is synchronous SGD; ``--metric`` is honoured or refused and the metric named;
the asynchrony penalty treats a missed target as a lower bound; the validation's tallies are out
of sample; a pilot recorded by an earlier trainer is detected.
"""

import json

import pytest

from anp_jax.research import perfmodel as pm
from anp_jax.research import planner as plan


def test_one_node_local_sgd_is_synchronous_sgd():
  """Local SGD averages over the node axis: on one node there is nothing to average and every
  step is a synchronous step, so no local-SGD penalty. (Before: 1 node, B=128 on MinoTauro:
  sync 256.2 steps, local SGD H=4 333.1 and H=16 640.6 with a 0.1 slope.)"""
  model = plan.pilot_model(128, 256.2, 128.0)
  pen = {'local_sgd': plan.Penalty(0.1, 0.05, 0.15, [(3.0, 1.3, 0.3)], [])}
  cluster, workload = pm.minotauro(nodes=4), pm.resnet50()
  sync = plan.plan_row(model, pen, cluster, workload, 1, 128, 'sync')
  for h in (4, 16):
    one = plan.plan_row(model, pen, cluster, workload, 1, 128, 'local_sgd', h)
    assert one.steps == pytest.approx(sync.steps), h
    assert one.steps_range == pytest.approx(sync.steps_range), h
    two = plan.plan_row(model, pen, cluster, workload, 2, 256, 'local_sgd', h)
    sync2 = plan.plan_row(model, pen, cluster, workload, 2, 256, 'sync')
    assert two.steps == pytest.approx(sync2.steps * (1 + 0.1 * (h - 1)))  # Two nodes: charged.
