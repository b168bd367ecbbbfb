"""anp_jax/research/stats.py: t quantiles, intervals over seeds, censored steps to target.

The t quantiles are checked against the printed table of Student's t (two-sided 95 %: 12.706,
4.303, 3.182, ...) and against scipy (a dependency of jax, so always installed with it); the
intervals against hand computation; the censored summaries on the issue's example (B=1024 with
seeds {reached at 40, diverged, diverged}).
"""

import math

import numpy as np
import pytest
import scipy.stats

from anp_jax.research import stats

# t(0.975, df) as printed in statistics tables (3 decimals).
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 19: 2.093,
           29: 2.045, 30: 2.042, 60: 2.000, 120: 1.980}


@pytest.mark.parametrize('df,expected', sorted(T_TABLE.items()))
def test_t_quantile_matches_the_printed_table(df, expected):
  assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)


def test_t_quantile_and_cdf_match_scipy_everywhere():
  for df in (1, 1.5, 2, 3, 7, 25, 100, 1000):
    for p in (0.001, 0.05, 0.3, 0.5, 0.8, 0.95, 0.995, 0.9999):
      assert stats.t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-9,
                                                      abs=1e-12), (p, df)
    for t in (-30.0, -2.0, -0.1, 0.0, 0.4, 3.0, 50.0):
      assert stats.t_cdf(t, df) == pytest.approx(scipy.stats.t.cdf(t, df), rel=1e-9,
                                                 abs=1e-14), (t, df)
  with pytest.raises(ValueError, match='0 < p < 1'):
    stats.t_quantile(1.0, 3)
  with pytest.raises(ValueError, match='df > 0'):
    stats.t_quantile(0.9, 0)


def test_t_interval_by_hand():
  s = stats.mean_interval([10.0, 12.0, 17.0])
  sd = math.sqrt(((10 - 13) ** 2 + (12 - 13) ** 2 + (17 - 13) ** 2) / 2)  # 3.606
  half = 4.302653 * sd / math.sqrt(3)
  assert (s['n'], s['mean'], s['method']) == (3, 13.0, 't')
  assert s['sd'] == pytest.approx(sd)
  assert (s['low'], s['high']) == pytest.approx((13 - half, 13 + half), rel=1e-6)
  one = stats.mean_interval([5.0])
  assert one['mean'] == 5.0 and one['low'] is None and one['sd'] is None
  with pytest.raises(ValueError, match='finite'):
    stats.mean_interval([1.0, float('nan')])
  with pytest.raises(ValueError, match='finite'):
    stats.mean_interval([])


def test_bootstrap_interval_is_seeded_and_inside_the_range():
  values = [10.0, 12.0, 17.0, 11.0, 14.0]
  a = stats.mean_interval(values, method='bootstrap')
  b = stats.mean_interval(values, method='bootstrap')
  assert a == b and a['method'] == 'bootstrap'
  assert min(values) <= a['low'] < a['mean'] < a['high'] <= max(values)
  t = stats.mean_interval(values)
  assert a['high'] - a['low'] < t['high'] - t['low']  # Few values: bootstrap is narrower.
  with pytest.raises(ValueError, match='Unknown interval method'):
    stats.mean_interval(values, method='jackknife')
  assert 'Student-t' in stats.describe_method('t')
  assert 'bootstrap' in stats.describe_method('bootstrap')


def test_t_interval_covers_the_true_mean_95_percent_of_the_time():
  rng = np.random.default_rng(0)
  hits = 0
  for _ in range(2000):
    s = stats.mean_interval(list(rng.normal(5.0, 2.0, size=3)))
    hits += s['low'] <= 5.0 <= s['high']
  assert 0.93 <= hits / 2000 <= 0.97


def test_a_seed_that_diverged_is_counted_not_dropped():
  """The issue's B=1024: seeds {reached at 40, diverged, diverged}, budget 79 steps."""
  s = stats.censored_summary([40.0, None, None], ['reached', 'diverged', 'diverged'],
                             [79, 79, 79])
  assert s['kind'] == 'censored' and s['mean'] is None
  assert (s['n'], s['reached'], s['diverged'], s['missed']) == (3, 1, 2, 0)
  assert s['lower_bound'] == pytest.approx((40 + 79 + 79) / 3)
  assert s['median'] is None  # Two of three never got there: the median is beyond the budget.
  assert stats.format_summary(s) == '≥ 66 (1/3 reached, 2 diverged)'
  # Two of three reached: the median is a reached value (the miss sorts above both).
  s = stats.censored_summary([40.0, 50.0, None], ['reached', 'reached', 'missed'], [79] * 3)
  assert s['median'] == 50.0 and s['lower_bound'] == pytest.approx(169 / 3)
  assert stats.format_summary(s) == '≥ 56 (2/3 reached, 1 missed; median 50)'
  # Even counts: the median of 4 needs its two middle values.
  s = stats.censored_summary([40.0, 50.0, 60.0, None], ['reached'] * 3 + ['missed'], [79] * 4)
  assert s['median'] == 55.0
  s = stats.censored_summary([40.0, 50.0, None, None], ['reached'] * 2 + ['missed'] * 2,
                             [79] * 4)
  assert s['median'] is None
  # All reached: mean and interval.
  s = stats.censored_summary([40.0, 50.0, 60.0], ['reached'] * 3, [79] * 3)
  assert s['kind'] == 'complete' and s['mean'] == 50.0 and s['low'] < 50.0 < s['high']
  assert stats.format_summary(s) == '50 [25, 75]'
  # A seed still training: no statistic yet.
  s = stats.censored_summary([40.0, None], ['reached', 'unfinished'], [79, 79])
  assert s['kind'] == 'unfinished' and stats.format_summary(s) == 'unfinished (1/2 seeds)'
  with pytest.raises(ValueError, match='only a reached target'):
    stats.censored_summary([40.0], ['missed'], [79])
  with pytest.raises(ValueError, match='Unknown outcome'):
    stats.censored_summary([None], ['lost'], [79])



def test_a_complete_interval_is_cut_at_the_floor_no_seed_can_go_below():
  """Steps 20, 40, 20 from evaluations every 20 steps: the t-interval reaches below 0 steps; with
  floor=20 it is cut there and marked, the mean and the upper end unchanged."""
  free = stats.censored_summary([20.0, 40.0, 20.0], ['reached'] * 3, [200] * 3)
  assert free['low'] < 0
  cut = stats.censored_summary([20.0, 40.0, 20.0], ['reached'] * 3, [200] * 3, floor=20)
  assert cut['low'] == 20 and cut['clipped'] is True
  assert (cut['mean'], cut['high']) == (free['mean'], free['high'])
  inside = stats.censored_summary([40.0, 50.0, 60.0], ['reached'] * 3, [79] * 3, floor=20)
  assert inside['low'] > 20 and 'clipped' not in inside
  assert stats.format_summary(cut) == f"27 [20, {cut['high']:.0f}]"

def test_a_final_metric_has_no_mean_when_a_seed_diverged():
  s = stats.value_summary([0.30, None, 0.34], ['reached', 'diverged', 'missed'])
  assert s['kind'] == 'diverged' and s['mean'] is None and s['diverged'] == 1
  assert (s['finished_min'], s['finished_max']) == (0.30, 0.34)
  assert stats.format_summary(s, '.1f', 100) == '— (1/3 diverged; others 30.0–34.0)'
  s = stats.value_summary([0.30, 0.32, 0.34], ['reached', 'missed', 'missed'])
  assert s['kind'] == 'complete' and s['mean'] == pytest.approx(0.32)
  s = stats.value_summary([0.30, None], ['missed', 'missed'])  # Never evaluated.
  assert s['kind'] == 'missing' and s['mean'] is None
  assert stats.format_summary(stats.value_summary([0.3], ['missed']), '.1f', 100) == '30.0 (1 seed)'


# ----------------------------------------------------------------------------------------------
# Comparisons of two points and the noise floor of one.


def test_welch_difference_matches_scipy_and_covers_the_true_difference():
  a, b = [10.0, 12.0, 17.0], [20.0, 21.0, 25.0, 30.0]
  d = stats.difference_interval(a, b)
  ref = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
  assert d['diff'] == pytest.approx(13.0 - 24.0)
  assert (d['low'], d['high']) == pytest.approx((ref.low, ref.high), rel=1e-9)
  one = stats.difference_interval([1.0], [2.0, 3.0])
  assert one['diff'] == -1.5 and one['low'] is None
  # Coverage: 2,000 experiments of 3 vs 3 normal draws with unequal spreads.
  rng = np.random.default_rng(0)
  hits = 0
  for _ in range(2000):
    d = stats.difference_interval(rng.normal(5.0, 1.0, 3), rng.normal(3.0, 3.0, 3))
    hits += d['low'] <= 2.0 <= d['high']
  assert 0.94 <= hits / 2000 <= 0.985  # Welch is slightly conservative at n = 3.


def test_ratio_of_means_by_hand():
  a, b = [200.0, 220.0, 240.0], [100.0, 100.0, 130.0]
  r = stats.ratio_interval(a, b)
  ma, mb = 220.0, 110.0
  va = np.var(a, ddof=1) / 3 / ma ** 2
  vb = np.var(b, ddof=1) / 3 / mb ** 2
  df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
  half = scipy.stats.t.ppf(0.975, df) * math.sqrt(va + vb)
  assert r['ratio'] == pytest.approx(2.0) and r['df'] == pytest.approx(df)
  assert (r['low'], r['high']) == pytest.approx((2 * math.exp(-half), 2 * math.exp(half)))
  with pytest.raises(ValueError, match='positive'):
    stats.ratio_interval([1.0, -1.0], [1.0, 2.0])


def test_spread_of_ten_seeds_by_hand():
  values = [100.0, 110.0, 95.0, 130.0, 105.0, 90.0, 120.0, 100.0, 115.0, 85.0]
  s = stats.spread(values)
  mean, sd = np.mean(values), np.std(values, ddof=1)
  t9 = scipy.stats.t.ppf(0.975, 9)
  assert (s['n'], s['min'], s['max']) == (10, 85.0, 130.0)
  assert (s['mean'], s['sd'], s['cv']) == pytest.approx((mean, sd, sd / mean))
  assert (s['q_low'], s['q_high']) == pytest.approx(tuple(np.quantile(values, [0.025, 0.975])))
  assert (s['run_low'], s['run_high']) == pytest.approx(
      (mean - t9 * sd * math.sqrt(1.1), mean + t9 * sd * math.sqrt(1.1)))
  assert s['mean_high'] - s['mean'] == pytest.approx(t9 * sd / math.sqrt(10))
  with pytest.raises(ValueError, match='at least 2'):
    stats.spread([1.0])


def test_detectable_difference_at_80_percent_power_and_at_50():
  """At 80 % power: (t(0.975) + t(0.8)) sd sqrt(2/3) for 3 + 3 runs, about 1.34x the interval's
  half-width (the old "detectable", a difference detected only half the time), and within 2 %
  of the noncentral t's exact power."""
  half = scipy.stats.t.ppf(0.975, 4) * 10.0 * math.sqrt(2 / 3)
  assert stats.detectable_difference(10.0, 3, 3, power=0.5) == pytest.approx(half)
  d = stats.detectable_difference(10.0, 3, 3)
  assert d == pytest.approx((scipy.stats.t.ppf(0.975, 4) + scipy.stats.t.ppf(0.8, 4)) * 10.0
                            * math.sqrt(2 / 3))
  assert d / half == pytest.approx(1.34, abs=0.005)
  nc = d / (10.0 * math.sqrt(2 / 3))
  crit = scipy.stats.t.ppf(0.975, 4)
  power = 1 - scipy.stats.nct.cdf(crit, 4, nc) + scipy.stats.nct.cdf(-crit, 4, nc)
  assert power == pytest.approx(0.8, abs=0.02)
  with pytest.raises(ValueError):
    stats.detectable_difference(1.0, 1, 1)
  with pytest.raises(ValueError, match='power'):
    stats.detectable_difference(1.0, 3, 3, power=1.0)


def test_p_values_of_the_welch_comparisons_match_scipy():
  a, b = [10.0, 12.0, 17.0], [20.0, 21.0, 25.0, 30.0]
  assert stats.difference_interval(a, b)['p'] == pytest.approx(
      scipy.stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
  assert stats.difference_interval([1.0], [2.0, 3.0])['p'] is None
  # The ratio's p-value: the delta method's t statistic, log(ratio) / se, with Welch's df.
  a, b = [200.0, 220.0, 240.0], [100.0, 100.0, 130.0]
  r = stats.ratio_interval(a, b)
  se = math.log(r['high'] / r['ratio']) / scipy.stats.t.ppf(0.975, r['df'])
  assert r['p'] == pytest.approx(2 * scipy.stats.t.sf(math.log(2.0) / se, r['df']), rel=1e-9)
  assert stats.t_p_value(2.0, 5) == pytest.approx(2 * scipy.stats.t.sf(2.0, 5), rel=1e-12)


def test_holm_by_hand():
  """Holm's step-down on 5 p-values, by hand: sorted 0.01, 0.02, 0.03, 0.04, 0.2 times 5, 4, 3,
  2, 1 = 0.05, 0.08, 0.09, 0.08 -> 0.09 (monotone), 0.2; in the input order."""
  p = [0.04, 0.01, 0.2, 0.03, 0.02]
  assert stats.holm(p) == pytest.approx([0.09, 0.05, 0.2, 0.09, 0.08])
  assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
  assert stats.holm([]) == []
  assert stats.simultaneous_level(0.95, 7) == pytest.approx(1 - 0.05 / 7)
  with pytest.raises(ValueError):
    stats.simultaneous_level(0.95, 0)


def test_pooled_log_ratios_are_one_anova_on_the_log_scale():
  """Three groups, one pooled SD of the log values (6 df): the ratio of geometric means and its
  t-interval, as scipy's t with the pooled standard error; the p-values Holm-adjusted."""
  groups = {'ref': [100.0, 110.0, 90.0], 'a': [150.0, 160.0, 140.0], 'b': [105.0, 95.0, 120.0]}
  out = stats.pooled_log_ratios(groups, 'ref')
  logs = {k: np.log(v) for k, v in groups.items()}
  sd = math.sqrt(sum(((v - v.mean()) ** 2).sum() for v in logs.values()) / 6)
  assert out['df'] == 6 and out['sd'] == pytest.approx(sd)
  se = sd * math.sqrt(2 / 3)
  for name in ('a', 'b'):
    diff = logs[name].mean() - logs['ref'].mean()
    r = out['ratios'][name]
    t = scipy.stats.t.ppf(0.975, 6)
    assert r['ratio'] == pytest.approx(math.exp(diff))
    assert (r['low'], r['high']) == pytest.approx((math.exp(diff - t * se),
                                                   math.exp(diff + t * se)))
    assert r['p'] == pytest.approx(2 * scipy.stats.t.sf(abs(diff) / se, 6))
  assert [out['ratios'][n]['p_holm'] for n in ('a', 'b')] == pytest.approx(
      stats.holm([out['ratios'][n]['p'] for n in ('a', 'b')]))


def test_clopper_pearson_matches_scipys_beta_quantiles():
  for k, n in ((0, 12), (9, 12), (12, 12), (15, 15), (3, 7)):
    ci = stats.clopper_pearson(k, n)
    low = 0.0 if k == 0 else scipy.stats.beta.ppf(0.025, k, n - k + 1)
    high = 1.0 if k == n else scipy.stats.beta.ppf(0.975, k + 1, n - k)
    assert (ci['low'], ci['high']) == pytest.approx((low, high), abs=1e-10), (k, n)
    assert ci['rate'] == k / n
  # 12 of 12 inside: the coverage is only shown to be above 73.5 %.
  assert stats.clopper_pearson(12, 12)['low'] == pytest.approx(0.025 ** (1 / 12))
  with pytest.raises(ValueError):
    stats.clopper_pearson(3, 2)


def test_a_clustered_interval_counts_each_cluster_once():
  values = [1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 5.0]
  clusters = ['a', 'a', 'a', 'b', 'b', 'b', 'c']
  ci = stats.clustered_mean_interval(values, clusters)
  means = [2.0, 11.0, 5.0]
  ref = stats.mean_interval(means)
  assert (ci['mean'], ci['low'], ci['high']) == pytest.approx((ref['mean'], ref['low'],
                                                              ref['high']))
  assert ci['clusters'] == 3 and ci['n'] == 7
  point = stats.mean_interval(values)
  assert (ci['point_low'], ci['point_high']) == pytest.approx((point['low'], point['high']))
  assert ci['high'] - ci['low'] > ci['point_high'] - ci['point_low']  # Wider: 2 df, not 6.
  with pytest.raises(ValueError):
    stats.clustered_mean_interval([1.0], ['a', 'b'])
