"""Canonical privacy-unit ids: one person, one id, whatever type the id arrived in."""
import decimal

import numpy as np
import pyarrow as pa
import pytest

from transforms.privacy_units import (UnitIdError, canonical_unit_column, canonical_unit_id,
                                      canonical_unit_ids, check_unit_type)


@pytest.mark.parametrize("column", [
    pa.array([7], pa.int8()), pa.array([7], pa.uint64()), pa.array([7.0]), pa.array([7.0], pa.float32()),
    pa.array(["7"]), pa.array([" +007 "]), pa.array(["7.000"]), pa.array(["\uff17"]),
    pa.array([decimal.Decimal("7.00")]), pa.array(["7"]).dictionary_encode()])
def test_every_spelling_of_seven_is_one_id(column):
    assert canonical_unit_ids(column).to_pylist() == ["7"]


def test_text_is_normalised_and_other_text_kept():
    got = canonical_unit_ids(pa.array(["Alice ", "ALICE", "x7", "-0", "-12.0", None])).to_pylist()
    assert got == ["alice", "alice", "x7", "0", "-12", None]


def test_nan_and_null_are_no_id():
    assert canonical_unit_ids(pa.array([np.nan, None, 3.0])).to_pylist() == [None, None, "3"]


def test_python_values_follow_the_array_rules():
    values = [7, np.int64(7), 7.0, "7", " 7 ", decimal.Decimal("7"), None, float("nan"), "Bob"]
    assert [canonical_unit_id(v) for v in values] == ["7"] * 6 + [None, None, "bob"]
    assert canonical_unit_column([7, "7", 7.0]).to_pylist() == ["7", "7", "7"]


@pytest.mark.parametrize("column", [pa.array([7.5]), pa.array([2.0 ** 60]), pa.array([np.inf]),
                                    pa.array([decimal.Decimal("7.5")])])
def test_values_without_a_canonical_form_are_refused_without_echoing_them(column):
    with pytest.raises(UnitIdError) as err:
        canonical_unit_ids(column, "user_id")
    assert "user_id" in str(err.value) and "7.5" not in str(err.value)


@pytest.mark.parametrize("typ", [pa.bool_(), pa.date32(), pa.binary(), pa.list_(pa.int64()),
                                 pa.timestamp("s")])
def test_types_that_are_not_ids_are_refused_before_any_work(typ):
    with pytest.raises(UnitIdError, match="user_id"):
        check_unit_type(typ, "user_id")


@pytest.mark.parametrize("value", [True, 7.5, b"7", object()])
def test_python_values_without_a_canonical_form_are_refused(value):
    with pytest.raises(UnitIdError):
        canonical_unit_id(value)
