"""The efficiency score against the paper's Table 1, within the printed rounding."""
import itertools

import pytest

from triaccel.metrics import efficiency_score, last5_mean

# Acc (%), Time (s), VRAM (GB), Eff. Score as printed in the paper's Table 1.
TABLE1 = [
    (77.0, 21.0, 0.35, 10.48), (77.2, 19.4, 0.32, 12.25), (78.1, 19.5, 0.31, 12.92),
    (78.3, 18.5, 0.30, 14.11), (78.7, 17.2, 0.26, 17.59), (79.4, 16.8, 0.26, 18.17),
    (68.2, 24.3, 0.38, 7.39), (68.7, 22.8, 0.35, 8.61), (69.9, 22.4, 0.34, 9.18),
    (72.8, 21.1, 0.33, 10.46), (73.1, 19.6, 0.31, 12.03), (74.3, 19.0, 0.29, 13.48),
]


@pytest.mark.parametrize("acc,time,vram,score", TABLE1)
def test_table1_within_rounding(acc, time, vram, score):
    # Every column is rounded: acc and time to 0.1, VRAM to 0.01, the score to 0.01.
    # The score is monotone in each input, so its range over the rounding box is at the corners.
    corners = [efficiency_score(a, t, v) for a, t, v in itertools.product(
        (acc - 0.05, acc + 0.05), (time - 0.05, time + 0.05), (vram - 0.005, vram + 0.005))]
    lo, hi = min(corners), max(corners)
    assert lo - 0.005 <= score <= hi + 0.005, (lo, hi, score)


def test_score_is_monotone_and_rejects_nonpositive():
    assert efficiency_score(80, 10, 0.3) > efficiency_score(79, 10, 0.3)
    assert efficiency_score(80, 10, 0.3) > efficiency_score(80, 11, 0.3)
    assert efficiency_score(80, 10, 0.3) > efficiency_score(80, 10, 0.31)
    with pytest.raises(ValueError):
        efficiency_score(80, 0, 0.3)


def test_last5_mean():
    assert last5_mean([100, 1, 2, 3, 4, 5]) == 3
    assert last5_mean([2, 4]) == 3


def test_steady_epoch_time_leaves_out_the_first_epoch_only_when_there_are_others():
    from triaccel.metrics import steady_epoch_time

    assert steady_epoch_time([9.0, 1.0, 2.0, 3.0]) == 2.0  # a 4-epoch search: the autotuning epoch is out
    assert steady_epoch_time([9.0, 1, 1, 1, 1, 1, 1, 6]) == 2.0  # 8 epochs: the paper's last five
    assert steady_epoch_time([5.0]) == 5.0


def test_a_peak_below_a_tenth_of_a_gib_is_said_in_mib_and_a_table_keeps_one_unit():
    """A CPU run of the digits model printed "mem 0.000 GiB" beside an efficiency in the millions."""
    from triaccel.units import mem_column, mem_text

    assert mem_text(0.314) == "0.314 GiB"
    assert mem_text(0.0034) == "3.48 MiB"
    assert mem_text(float("nan")) == "nan GiB"  # a result without the metric
    assert mem_column([0.003, 0.05, float("nan")]) == ("MiB", 1024.0)
    assert mem_column([0.003, 0.2]) == ("GiB", 1.0)  # one unit for every row of a table
    assert mem_column([]) == ("GiB", 1.0)
