"""Canonical privacy-unit ids: one person, one id, whatever type the id arrived in."""
import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from transforms.privacy_units import (UnitIdError, canonical_unit_column, canonical_unit_dictionary,
                                      canonical_unit_id, canonical_unit_ids, check_unit_type)


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


_SPELLINGS = ["7", " 7", "+007", "7.0", "Alice", "alice ", "ALICE", "\uff17", "-0", "0", "x", None,
              "7e0", "\u0667", "Stra\u00dfe", "STRASSE", "strasse", "x\u200b", "7.50", "75e-1"]


def _columns():
    ints = st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=60)
    floats = st.lists(st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.0, 7.0, -3.0, np.nan])),
                      max_size=60)
    texts = st.lists(st.sampled_from(_SPELLINGS), max_size=60)
    return st.one_of(ints.map(lambda v: pa.array(v, pa.int64())),
                     ints.map(lambda v: pa.array(v, pa.int8())),
                     floats.map(lambda v: pa.array(v, pa.float64())),
                     texts.map(lambda v: pa.array(v, pa.string())),
                     texts.map(lambda v: pa.array(v, pa.string()).dictionary_encode()),
                     texts.map(lambda v: pa.chunked_array([pa.array(v[:3], pa.string()),
                                                           pa.array(v[3:], pa.string())])))


@settings(max_examples=300, deadline=None)
@given(_columns())
def test_the_dictionary_form_decodes_to_the_canonical_ids(column):
    """Distinct canonical ids, numbered by first appearance (what bounding's per-distinct hashing
    reads), and decoded the very ids canonical_unit_ids gives, nulls included."""
    got = canonical_unit_dictionary(column, "user_id")
    assert got.dictionary_decode().to_pylist() == canonical_unit_ids(column, "user_id").to_pylist()
    assert len(set(got.dictionary.to_pylist())) == len(got.dictionary)
    codes = [i for i in got.indices.to_pylist() if i is not None]
    assert sorted(set(codes)) == list(range(len(got.dictionary)))  # every entry used
    first = list(dict.fromkeys(codes))
    assert first == sorted(first)  # numbered in order of first appearance


def test_the_dictionary_form_refuses_what_the_ids_refuse():
    for column in (pa.array([1.0, 7.5]), pa.array([True])):
        with pytest.raises(UnitIdError, match="user_id"):
            canonical_unit_dictionary(column, "user_id")



# The rules (transforms/privacy_units.py), one row each: text spellings -> their canonical id.
RULES = [
    # rule                              spellings                                          canonical
    ("case: lower-cased",               ["Alice", "ALICE", "alice"],                       "alice"),
    ("case: full case folding",         ["Stra\u00dfe", "STRASSE", "strasse", "STRA\u1e9eE"], "strasse"),
    ("case: folds compatibility forms", ["\ufb00", "FF", "\uff26\uff26"],                  "ff"),
    ("white space around: stripped",    [" bob ", "\tbob\n", "\u00a0bob\u3000"],            "bob"),
    ("format characters: removed",      ["bo\u200bb", "\ufeffbob", "b\u00adob", "bob\u200d",
                                         "\u2066bob\u2069"],                               "bob"),
    ("NFKC: compatibility forms",       ["\u2460", "1"],                                    "1"),
    ("digits of every script: ASCII",   ["7", "\uff17", "\u0667", "\u096d", "\u07c7"],          "7"),
    ("digits inside text: ASCII",       ["user\u0667", "user7", "USER\uff17"],               "user7"),
    ("integer text: the integer",       ["7", "+7", "007", " +007 ", "7.", "7.000"],        "7"),
    ("exponents: the number",           ["7e0", "7E0", "0.7e1", "70e-1", "+7.0E+0"],        "7"),
    ("signed zero: zero",               ["0", "-0", "+0", "-0.0", "0e5", "000"],            "0"),
    ("negative integers",               ["-12", "-12.0", "-1.2e1", "-012"],                 "-12"),
    ("non-integral: exact decimal",     ["7.5", "7.50", "75e-1", "+7.5", ".75e1"],          "7.5"),
    ("small numbers: plain decimal",    ["1e-3", "0.001", ".001"],                          "0.001"),
    ("other text: kept as folded",      ["0x1F", "0x1f"],                                   "0x1f"),
    ("not numbers: kept",               ["inf", "INF"],                                     "inf"),
]


@pytest.mark.parametrize("rule, spellings, canonical", RULES, ids=[r[0] for r in RULES])
def test_the_canonical_form_rules(rule, spellings, canonical):
    """Each row of the rules table: every spelling is one unit, in the array form (one array
    mixing ASCII and non-ASCII spellings: the fast path and the folded path agree), the
    dictionary form and the scalar form."""
    column = pa.array(spellings + [None])
    assert canonical_unit_ids(column, "user_id").to_pylist() == [canonical] * len(spellings) + [None]
    assert canonical_unit_dictionary(column, "user_id").dictionary.to_pylist() == [canonical]
    assert [canonical_unit_id(v) for v in spellings] == [canonical] * len(spellings)


def test_numbers_and_their_text_agree():
    """``7`` as a number and ``"7"``, ``"7e0"``, ``"٧"`` as text are one unit; so are integral
    floats and decimals and their text."""
    numbers = [pa.array([7]), pa.array([7], pa.uint8()), pa.array([7.0]), pa.array([decimal.Decimal("7.0")])]
    texts = pa.array(["7", "7e0", "\u0667", "7.00", "\uff17"])
    assert {canonical_unit_ids(c).to_pylist()[0] for c in numbers} | \
        set(canonical_unit_ids(texts).to_pylist()) == {"7"}
    assert canonical_unit_ids(pa.array([-3.0, 2.0 ** 52])).to_pylist() == ["-3", "4503599627370496"]
    assert canonical_unit_ids(pa.array(["-3", "4503599627370496e0"])).to_pylist() == ["-3", "4503599627370496"]


@pytest.mark.parametrize("value", ["1e999", "1e64", "-1.5e-70", "9" * 3 + "e100"])
def test_numeric_text_that_expands_past_64_digits_is_refused_naming_the_column(value):
    with pytest.raises(UnitIdError) as err:
        canonical_unit_ids(pa.array(["alice", value]), "user_id")
    assert "user_id" in str(err.value) and value not in str(err.value)
    assert canonical_unit_ids(pa.array(["1" * 200])).to_pylist() == ["1" * 200]  # long plain digits


def test_ascii_and_non_ascii_batches_give_the_same_ids():
    """Batches cut differently (all-ASCII batches take the fast path) map each spelling alike."""
    spellings = ["Bob", "b\u200bob", "BOB", "\u0661\u0662", "12", "x"]
    together = canonical_unit_ids(pa.array(spellings)).to_pylist()
    alone = [canonical_unit_ids(pa.array([v])).to_pylist()[0] for v in spellings]
    assert together == alone == ["bob", "bob", "bob", "12", "12", "x"]


def test_values_without_a_canonical_form_are_marked_not_raised_in_the_row_rule_form():
    """unit_ids_and_faults (issue 40): the same ids as canonical_unit_ids where there is one;
    a value without one is null and marked, so the caller drops and counts its row."""
    import decimal

    from transforms.privacy_units import unit_ids_and_faults

    ids, bad = unit_ids_and_faults(pa.array(["7", "1e999", None, " A7", "7.5", "1e64"]))
    assert ids.to_pylist() == ["7", None, None, "a7", "7.5", None]
    assert bad.tolist() == [False, True, False, False, False, True]
    ids, bad = unit_ids_and_faults(pa.array([7.0, float("inf"), 7.5, float("nan"), None, 2.0 ** 60]))
    assert ids.to_pylist() == ["7", None, None, None, None, None]
    assert bad.tolist() == [False, True, True, False, False, True]
    ids, bad = unit_ids_and_faults(pa.array([decimal.Decimal("7.00"), decimal.Decimal("7.5"), None]))
    assert ids.to_pylist() == ["7", None, None] and bad.tolist() == [False, True, False]
    with pytest.raises(UnitIdError):   # a column type that holds no ids: still a schema fault
        unit_ids_and_faults(pa.array([True, False]))
