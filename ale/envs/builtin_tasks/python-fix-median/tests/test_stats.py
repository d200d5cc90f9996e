import sys

sys.path.insert(0, "/workspace")
import stats


def test_odd():
  assert stats.median([3, 1, 2]) == 2


def test_even():
  assert stats.median([4, 1, 3, 2]) == 2.5


def test_single():
  assert stats.median([7]) == 7


def test_input_unchanged():
  xs = [3, 1, 2]
  stats.median(xs)
  assert xs == [3, 1, 2]


def test_mean_still_works():
  assert stats.mean([1, 2, 3]) == 2
