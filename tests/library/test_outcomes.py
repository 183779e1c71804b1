import pytest

from utils import outcomes


def test_chance_band_and_verdict():
    low, high = outcomes.chance_band(10, 400)
    assert low < 0.1 < high and high - 0.1 == pytest.approx(3 * (0.1 * 0.9 / 400) ** 0.5)
    assert outcomes.accuracy_verdict(0.11, 10, 400).startswith("11.0% is at chance level")
    assert outcomes.accuracy_verdict(0.5, 10, 400).startswith("50.0% is above chance")
    with pytest.raises(ValueError, match="n_classes >= 2"):
        outcomes.chance_band(1, 10)


def test_trend():
    assert outcomes.trend([1.0, 0.5, 2.0]) == "rose"
    assert outcomes.trend([2.0, 1.0]) == "fell"
    assert outcomes.trend([1.0, 1.01]) == "stayed flat"


def test_levels_off_and_minimum():
    assert outcomes.levels_off_at([1, 4, 16, 64], [10, 40, 60, 61]) == 16
    assert outcomes.levels_off_at([1, 4], [10, 40]) is None
    assert outcomes.rises_after_minimum([4, 16, 64, 256], [2.0, 1.5, 1.7, 1.9]) == (16, True)
    assert outcomes.rises_after_minimum([4, 16, 64, 256], [2.0, 1.5, 1.7, 1.6]) == (16, False)
