"""The sync/async/mixed experiment's ``cpu`` preset: every arm mapped to the 16-K80 cluster, each
at its own learning rate tuned on validation, 3 seeds.

  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out DIR --stop_at_target

One command, two parts (``parts`` below), each a process of its own: the arms on one simulated
device (sync, async, mixed), then the local-SGD arms on four (a node per device); the second
part's results and summary cover every arm of DIR. The command runs them in turn, as:

  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out DIR --stop_at_target \\
      --nodes=
  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out DIR --stop_at_target \\
      --workers= --mixed= --cpu_devices=4

(either one alone, or any of these flags given, runs that invocation only).

The proxy of the batch-size sweep's cpu preset (ResNet-20 width 0.5 at 16 px, 8,000 train /
1,696 validation / 1,696 test images, 32 ANPs, nesterov, 1 warmup epoch, cosine), at most 8
epochs, evaluation of both splits every half epoch, target 25 % ANP top-1.

**Mapped to the cluster** (``device_batch=32`` images per K80, ``sync_devices=16``): every arm
trains with the examples per update it has on 16 K80s, so staleness in examples is the
cluster's: sync 512 per update; async-16 (16 device workers) 32 per update, mean staleness 15
updates = 480 examples, with and without momentum compensated for asynchrony (``-comp``:
``async_sgd.momentum='compensate'``, Mitliagkas, Zhang, Hadjis and Ré, "Asynchrony begets
momentum, with an application to deep learning", Allerton 2016: explicit momentum 0.9 -
(1 - 1/16) -> 0); mixed-asynchronous N = 4 workers of 4 devices (128 per update, staleness 3 =
384 examples) and N = 8 of 2 (64 per update, staleness 7 = 448 examples); local SGD over 4 nodes
x 4 devices (512 per step = 4 nodes x 128) averaging every H = 1, 4, 16 steps. BatchNorm over
the 32 images of one device (ghost BN over 32), as on the cluster. The rate grid is centred on
the square-root rule (0.4 per 256: 0.57 at 512, 0.14 at 32), x0.5, 1, 2, extended by factors of
2 beyond an edge choice, at most four times (the fourth made the last two edge arms,
async-16 and mixed-8, interior). With ``--stop_at_target`` each run ends at the
later of its validation and test crossings (examples to the target are the comparison); an arm
that misses trains 8 epochs.

Time (``--dry_run`` prints the estimate; ~700 img/s on the loaded 2 cores): 8 arms x 3 rates x
3 seeds = 72 runs, most stopping at 2-5 epochs (~15 s an epoch with the evaluations) ≈ 1.7 h,
plus extension runs. Results: ``experiments/results/sync_async_mixed_cpu/`` (docs/studies.md,
section 3, with what it cost).
"""

from anp_jax.configs import sweep_cpu


def experiment_config(c, batch_size: int, num_epochs: float, eval_every_epochs: float):
  """A batch-size sweep preset's config turned into this experiment's (every arm sets method;
  a mapped preset sets the batch per arm too)."""
  c.batch_size = batch_size
  c.num_epochs = num_epochs
  c.eval_every_epochs = eval_every_epochs
  c.checkpoint_every_minutes = 0
  c.progress_bar = False
  return c


def get_config():
  c = experiment_config(sweep_cpu.get_config(), 512, 8.0, 0.5)
  c.bn_group_size = 32  # One K80's batch.
  return c


def get_sweep():
  return dict(workers=(16,), nodes=(4,), sync_every=(1, 4, 16), aware=(False,),
              compensate=(False, True), mixed=(4, 8), mixed_aware=(False,), cpu_devices=1,
              lr_grid=(0.5, 1.0, 2.0), lr_extensions=4, seeds=(0, 1, 2), target_top1=0.25,
              device_batch=32, sync_devices=16, images_per_s=520.0, overhead_s=15.0,
              parts=({'nodes': ''}, {'workers': '', 'mixed': '', 'cpu_devices': '4'}))
