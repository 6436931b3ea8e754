import math

import pytest

from slotune.stats import mean, percentile


def test_percentile_matches_linear_interpolation() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 10
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 95) == pytest.approx(9.55)
    assert percentile([3.0], 95) == 3


def test_percentile_of_nothing_is_nan_and_bad_p_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    assert math.isnan(mean([]))
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], 101)
