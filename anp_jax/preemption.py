"""Process-wide preemption state and cheap step agreement across processes.

* **One flag per process.** SIGTERM / SIGUSR1 (what SLURM sends with ``--signal``) set a
  module-level flag; `install()` puts the handler in place once and it stays for the life of the
  process. The flag therefore survives from one run to the next: a signal that lands in a run's
  final evaluation, in plotting, or between two runs of a sweep is still seen, by the next run's
  first step or by `exit_if_requested()` between runs.
* **Ctrl-C.** With ``install(ctrl_c=True)`` (the trainer's command line) SIGINT sets the flag
  too: Ctrl-C at a terminal stops the run the same way, with a checkpoint and exit 75, but the
  run then says that it stopped and how to resume, not that a launcher requeues it
  (`interrupted`, `stop_message`); a second Ctrl-C stops at once, without a checkpoint
  (KeyboardInterrupt).
* **Bounded run-ahead.** JAX dispatches steps asynchronously; the Python loop would otherwise run
  up to the next host fetch (``log_every_steps``) ahead of the devices and see the flag that much
  later. `RunAhead` blocks on the outputs of the step `MAX_IN_FLIGHT` back, so at most
  `MAX_IN_FLIGHT` steps are queued behind the one the loop is at (enough to keep a device busy).
* **Agreement without a per-step collective.** `StepAgreement` decides, identically on every
  process, at which step to save and whether to stop, through the key-value store of
  jax.distributed's coordination service: a process that sees the signal at step ``s`` proposes
  the stop step ``s + STOP_MARGIN`` (the first proposal wins); process 0 alone proposes the
  time-based saves. Every process reads the run's keys after every `READ_EVERY`-th step (one
  get, no device work). Because of the bounded run-ahead no process can be more than
  `MAX_IN_FLIGHT` + 1 steps past another, so all of them read a proposal before they reach its
  step and stop at that same step. One process: no store, the stop is the step at which the
  flag is seen.

Bound (docs/checkpointing.md): a signal is acted on at most ``MAX_IN_FLIGHT + 1`` step times after
it arrives with one process, and ``STOP_MARGIN + MAX_IN_FLIGHT + 1`` with several, plus an
evaluation that is running when it arrives, then the checkpoint is written.
"""

import collections
import itertools
import logging
import os
import signal
from typing import Any, Optional, Tuple

from anp_jax import distributed  # No JAX: `install` runs before the slow imports.
from anp_jax.errors import EXIT_PREEMPTED, Preempted
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
MAX_IN_FLIGHT = 2  # Steps dispatched beyond the last one known to have finished.
# Every process reads the key-value store after the steps that are multiples of READ_EVERY: a
# read is a gRPC round trip to the coordinator (~0.5 ms idle, 2.6 ms measured per step with two
# processes on two busy cores, 10 % of a small model's step), so not after every step.
READ_EVERY = 4
# Steps between a proposal and the step it names: another process may be MAX_IN_FLIGHT + 1
# steps ahead when the proposal is written and may have just read, so its next read comes at
# most READ_EVERY steps later; it must come no later than the proposed step.
STOP_MARGIN = MAX_IN_FLIGHT + 1 + READ_EVERY

_signal: Optional[int] = None
_interrupted = False  # SIGINT (Ctrl-C) was among the signals received.
_installed = False
_runs = itertools.count()  # Per-process count of agreements made: the same on every process.


def _on_signal(signum, frame):
  del frame
  global _signal
  _signal = signum
  if not _interrupted:  # After a Ctrl-C: run.sh forwarding it (said already).
    logging.warning('Received signal %d: checkpointing at the next step boundary.', signum)


def _on_interrupt(signum, frame):
  """SIGINT (Ctrl-C): as a preemption signal, said at once on the terminal. The next Ctrl-C
  raises KeyboardInterrupt (Python's own handler), for a user who does not want to wait. Run
  by `run.sh`, the trainer also gets a SIGTERM from it (its trap forwards the Ctrl-C): that one
  only sets the flag again."""
  del frame
  global _signal, _interrupted
  _interrupted = True
  if _signal is None:
    _signal = signum
  signal.signal(signal.SIGINT, signal.default_int_handler)
  # os.write: a print or a log record here could re-enter a write the main thread was doing.
  lead = '\n' if os.isatty(2) else ''  # Off the progress bar's line.
  os.write(2, (f'{lead}Ctrl-C: stopping at the next step boundary with a checkpoint (Ctrl-C '
               'again: stop at once, without one).\n').encode())


def install(ctrl_c: bool = False) -> None:
  """Installs the SIGTERM/SIGUSR1 handler once per process (later calls do nothing but add the
  SIGINT one if `ctrl_c` and it is not there yet). `ctrl_c`: for a command line (not in IPython,
  where Ctrl-C must interrupt a cell as usual)."""
  global _installed
  if ctrl_c and signal.getsignal(signal.SIGINT) is not _on_interrupt and not _interrupted:
    try:
      signal.signal(signal.SIGINT, _on_interrupt)
    except ValueError:  # Not the main thread.
      pass
  if _installed:
    return
  for sig in SIGNALS:
    try:
      signal.signal(sig, _on_signal)
    except ValueError:  # Not the main thread (e.g. inside some notebook runners).
      return
  _installed = True


def requested() -> Optional[int]:
  """The signal number received by this process (None: none so far)."""
  return _signal


def interrupted() -> bool:
  """Whether the stop was asked for with Ctrl-C (SIGINT) rather than by a scheduler."""
  return _interrupted


def stop_message(step: Optional[int], what: str = '') -> str:
  """What the run says when it stops on the flag: at `step` (its checkpoint written), or before
  `what` (between runs). Ctrl-C: that it stopped and how to resume; a scheduler's signal: the
  exit code the launcher requeues on."""
  if _interrupted:
    where = f'at step {step}, checkpoint written' if step is not None else f'before {what}'
    return f'Stopped (Ctrl-C) {where}. Rerun the same command to resume.'
  if step is not None:
    return (f'Preempted: checkpoint written at step {step}; exiting with code {EXIT_PREEMPTED} so '
            'that the launcher requeues the job.')
  return (f'Preempted before {what}: exiting with code {EXIT_PREEMPTED} so that the launcher '
          'requeues the job; rerun the same command to continue.')


def reset() -> None:
  """Forgets a received signal (for tests and interactive use after handling it)."""
  global _signal, _interrupted
  _signal = None
  _interrupted = False


def any_process_requested() -> bool:
  """Whether any process got the signal. Every process must call it (in the same order).

  Through the coordination service's key-value store and a barrier (`distributed.exchange`,
  bounded by ``ANP_BARRIER_TIMEOUT`` and named in its error), not a device collective: between
  two runs one process may still be finishing the last one's reports, and a collective waits
  without saying for what (on GPUs, NCCL's for ever)."""
  import jax
  local = _signal is not None
  if jax.process_count() == 1:
    return local
  got = distributed.exchange('preemption_check', '1' if local else '0',
                             'preemption signals (between two runs)')
  return '1' in got.values()


def exit_if_requested(what: str = 'the next run') -> None:
  """Between runs: raises `Preempted` (exit 75) on every process if any got the signal."""
  if any_process_requested():
    from anp_jax import reporting
    reporting.say(stop_message(None, what))
    raise Preempted()


class RunAhead:
  """Keeps at most `MAX_IN_FLIGHT` dispatched steps unfinished (see the module docstring)."""

  def __init__(self, limit: int = MAX_IN_FLIGHT):
    self.limit = limit
    self._outputs = collections.deque()

  def push(self, outputs: Any) -> None:
    """Call after dispatching a step with (some of) its outputs; may wait for an older step."""
    self._outputs.append(outputs)
    while len(self._outputs) > self.limit:
      import jax
      jax.block_until_ready(self._outputs.popleft())


class StepAgreement:
  """Save/stop decisions every process takes at the same step, without a device collective.

  Create one per run on every process (in the same order). `due(step, local_save)` after each
  dispatched step returns (save, stop); `local_save` is process 0's time-based trigger (other
  processes' value is ignored so that one clock decides).
  """

  def __init__(self, client=None, process_index: Optional[int] = None,
               process_count: Optional[int] = None, run_id: Optional[str] = None):
    """The arguments replace jax.distributed's client, the process index/count and the run's
    key prefix (tests simulate several processes in one)."""
    install()
    import jax
    count = jax.process_count() if process_count is None else process_count
    self.multi = count > 1
    self.index = jax.process_index() if process_index is None else process_index
    self.prefix = f'anp_jax/agree/{next(_runs) if run_id is None else run_id}/'
    self.stop_at: Optional[int] = None
    self._proposed_stop = False
    self._save_steps = set()
    self._saves_proposed = 0
    if client is None and self.multi:
      client = distributed.coordination_client()
    self._client = client

  def due(self, step: int, local_save: bool = False) -> Tuple[bool, bool]:
    """(save at `step`?, stop at `step`?) for the step just dispatched; same on all processes."""
    if not self.multi:
      stop = _signal is not None
      return bool(local_save or stop), stop
    if _signal is not None and not self._proposed_stop and self.stop_at is None:
      self._propose('stop', step + STOP_MARGIN, first_wins=True)
      self._proposed_stop = True
    if local_save and self.index == 0 and not self._pending_save(step):
      self._propose(f'save/{self._saves_proposed}', step + STOP_MARGIN)
      self._saves_proposed += 1
    if step % READ_EVERY == 0:
      self._read()
    stop = self.stop_at is not None and step >= self.stop_at
    if self.stop_at is not None and step > self.stop_at:  # Cannot happen (see the docstring).
      raise RuntimeError(f'Stop step {self.stop_at} agreed too late (now at step {step}).')
    save = stop or step in self._save_steps
    return save, stop

  def _pending_save(self, step: int) -> bool:
    """Whether a proposed save is still to come (the timer stays due until it is taken)."""
    return any(s >= step for s in self._save_steps) or self._saves_proposed > len(
        self._save_steps)

  def _propose(self, key: str, step: int, first_wins: bool = False):
    try:
      self._client.key_value_set(self.prefix + key, str(step), allow_overwrite=not first_wins)
    except Exception:  # Another process proposed first: its value stands.
      if not first_wins:
        raise

  def _read(self):
    for key, value in self._client.key_value_dir_get(self.prefix):
      name = key[len(self.prefix):]
      if name == 'stop':
        self.stop_at = int(value)
      else:
        self._save_steps.add(int(value))
