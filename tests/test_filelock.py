"""The dataset-preparation lock: it says who holds it, and gives up with an error instead of
waiting for ever behind a stuck process."""

import fcntl
import logging
import os
import threading
import time

import pytest

from anp_jax.data import filelock, pipeline


def _hold(path):
  """Takes the lock the way another process would (another open file description)."""
  f = open(path, 'a')
  fcntl.flock(f, fcntl.LOCK_EX)
  return f


def test_a_held_lock_is_reported_with_its_holder_then_given_up_on(tmp_path, caplog):
  path = str(tmp_path / '.prepare.lock')
  held = _hold(path)
  try:
    assert filelock.holders(path) == [os.getpid()]
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
      with pytest.raises(TimeoutError) as error:
        with filelock.exclusive(path, 'preparing x', timeout_s=0.6, notice_after_s=0.2,
                                poll_s=0.05):
          raise AssertionError('got a lock that another holder has')
    assert 0.6 <= time.monotonic() - t0 < 5
  finally:
    held.close()
  message = str(error.value)
  assert path in message and f'pid {os.getpid()}' in message and 'preparing x' in message
  assert isinstance(error.value, OSError)  # The entry points' exit code 2.
  notices = [r.getMessage() for r in caplog.records if 'Waiting for the lock' in r.getMessage()]
  assert len(notices) == 1 and f'pid {os.getpid()}' in notices[0], notices


def test_the_lock_is_taken_once_the_holder_lets_go_and_is_exclusive_while_held(tmp_path, caplog):
  path = str(tmp_path / '.prepare.lock')
  held = _hold(path)
  threading.Timer(0.4, held.close).start()
  with caplog.at_level(logging.WARNING):
    with filelock.exclusive(path, 'preparing x', timeout_s=30, notice_after_s=0.1, poll_s=0.05):
      assert filelock.holders(path) == [os.getpid()]
      with open(path, 'a') as other:  # Nobody else gets it meanwhile.
        with pytest.raises(BlockingIOError):
          fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
  assert filelock.holders(path) == []  # Released on exit.
  assert any('Got the lock' in r.getMessage() for r in caplog.records)
  caplog.clear()
  with caplog.at_level(logging.WARNING):  # Uncontended: silent.
    with filelock.exclusive(path, 'preparing x', timeout_s=1):
      pass
  assert not caplog.records


def test_dataset_preparation_gives_up_after_the_barrier_timeout(tmp_path, monkeypatch):
  """A process stuck (or stopped) while it holds a data_dir's lock: the next job fails after
  ANP_BARRIER_TIMEOUT with the holder named, instead of hanging before its first step."""

  class Builder:  # Never reached: the lock is not granted.
    name = 'synthetic_anp'

  monkeypatch.setenv('ANP_BARRIER_TIMEOUT', '1')
  held = _hold(str(tmp_path / '.prepare.lock'))
  try:
    with pytest.raises(TimeoutError, match=f'preparing synthetic_anp in {tmp_path}.*pid '
                                           f'{os.getpid()}'):
      pipeline._prepare_once(Builder(), str(tmp_path))
  finally:
    held.close()
