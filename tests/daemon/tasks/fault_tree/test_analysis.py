"""Fault-tree checks and analysis (rung.daemon.tasks.fault_tree), against brute-force references."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from rung.daemon.tasks.fault_tree.analysis import analyze_fault_tree

Tree = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Independent reference: evaluate the tree on every one of the 2^n states.


def _evaluator(tree: Mapping[str, Any]) -> Callable[[Mapping[str, bool]], bool]:
    gates = {g["id"]: g for g in tree["gates"]}

    def ev(nid: str, state: Mapping[str, bool]) -> bool:
        if nid not in gates:
            return bool(state[nid])
        g = gates[nid]
        vals = [ev(i, state) for i in g["inputs"]]
        match g["type"]:
            case "AND":
                return all(vals)
            case "OR":
                return any(vals)
            case "ATLEAST":
                return sum(vals) >= int(g["k"])
            case "NOT":
                return not vals[0]
            case "INHIBIT":
                return vals[0] and state[g["condition"]]
        raise AssertionError(g)

    return lambda state: ev(tree["top"], state)


def _probs(tree: Mapping[str, Any]) -> dict[str, float]:
    t = tree.get("mission_time_h", 8760.0)
    return {e["id"]: e["probability"] if "probability" in e
            else 1.0 - math.exp(-e["failure_rate"] * t) for e in tree["basic_events"]}


def brute_force_probability(tree: Mapping[str, Any]) -> float:
    top, probs = _evaluator(tree), _probs(tree)
    ids = sorted(probs)
    total = 0.0
    for bits in itertools.product((False, True), repeat=len(ids)):
        state = dict(zip(ids, bits, strict=True))
        if top(state):
            total += math.prod(probs[i] if state[i] else 1.0 - probs[i] for i in ids)
    return total


def brute_force_prime_implicants(tree: Mapping[str, Any]) -> list[list[str]]:
    """All prime implicants, by checking every cube (3^n) against the truth table."""
    top = _evaluator(tree)
    ids = sorted(e["id"] for e in tree["basic_events"])
    true_states = {bits for bits in itertools.product((False, True), repeat=len(ids))
                   if top(dict(zip(ids, bits, strict=True)))}

    def implies_top(cube: dict[int, bool]) -> bool:
        free = [i for i in range(len(ids)) if i not in cube]
        for bits in itertools.product((False, True), repeat=len(free)):
            state = [False] * len(ids)
            for i, v in cube.items():
                state[i] = v
            for i, v in zip(free, bits, strict=True):
                state[i] = v
            if tuple(state) not in true_states:
                return False
        return True

    implicants = []
    for values in itertools.product((None, True, False), repeat=len(ids)):
        cube = {i: v for i, v in enumerate(values) if v is not None}
        if implies_top(cube):
            implicants.append(frozenset(cube.items()))
    primes = [c for c in implicants if not any(o < c for o in implicants)]
    as_lists = [sorted(((ids[i], v) for i, v in c), key=lambda x: (x[0], not x[1]))
                for c in primes]
    as_lists.sort(key=lambda lits: (len(lits), [(e, not v) for e, v in lits]))
    return [[e if v else f"NOT {e}" for e, v in lits] for lits in as_lists]


def _events(probs: Mapping[str, float]) -> list[dict[str, Any]]:
    return [{"id": k, "probability": v} for k, v in probs.items()]


def _paths(issues: list[dict[str, str]]) -> list[str]:
    return [i["path"] for i in issues]


# ---------------------------------------------------------------------------------------------
# A known tree


KNOWN: Tree = {
    "top": "TOP",
    "description": "line stops",
    "gates": [
        {"id": "TOP", "type": "OR", "inputs": ["G_AB", "C", "G_2OF3"]},
        {"id": "G_AB", "type": "AND", "inputs": ["A", "B"]},
        {"id": "G_2OF3", "type": "ATLEAST", "k": 2, "inputs": ["D", "E", "F"]},
    ],
    "basic_events": _events({"A": 0.1, "B": 0.2, "C": 0.05, "D": 0.3, "E": 0.4, "F": 0.5}),
}


def test_known_tree_cut_sets_and_exact_probability() -> None:
    r = analyze_fault_tree(KNOWN)
    assert r["ok"] and r["errors"] == [] and r["warnings"] == []
    assert r["minimal_cut_sets"] == [["C"], ["A", "B"], ["D", "E"], ["D", "F"], ["E", "F"]]
    assert r["coherent"] is True and r["cut_set_kind"] == "minimal_cut_sets"
    assert r["cut_sets_complete"] is True
    # By hand: P(A.B) = 0.02; P(2 of D,E,F) = .12 + .15 + .20 - 2 * .06 = 0.35;
    # P(top) = 1 - (1 - .02)(1 - .05)(1 - .35) = 1 - .98 * .95 * .65 = 0.39485.
    assert r["top_probability"] == pytest.approx(0.39485, rel=1e-12)
    assert r["top_probability"] == pytest.approx(brute_force_probability(KNOWN), rel=1e-12)
    # Rare-event approximation: .05 + .02 + .12 + .15 + .20 = 0.54 (exceeds the exact value).
    assert r["rare_event_approximation"] == pytest.approx(0.54, rel=1e-12)
    assert r["basic_event_probabilities"] == {"A": 0.1, "B": 0.2, "C": 0.05, "D": 0.3,
                                              "E": 0.4, "F": 0.5}


def test_top_may_be_a_basic_event() -> None:
    r = analyze_fault_tree({"top": "A", "gates": [], "basic_events": _events({"A": 0.25})})
    assert r["ok"] and r["minimal_cut_sets"] == [["A"]] and r["top_probability"] == 0.25


def test_inhibit_gate_is_input_and_condition() -> None:
    tree: Tree = {
        "top": "TOP",
        "gates": [
            {"id": "TOP", "type": "INHIBIT", "inputs": ["G"], "condition": "COND"},
            {"id": "G", "type": "OR", "inputs": ["A", "B"]},
        ],
        "basic_events": _events({"A": 0.1, "B": 0.2, "COND": 0.5}),
    }
    r = analyze_fault_tree(tree)
    assert r["ok"], r["errors"]
    assert r["minimal_cut_sets"] == [["A", "COND"], ["B", "COND"]]
    assert r["top_probability"] == pytest.approx(0.5 * (1 - 0.9 * 0.8), rel=1e-12)
    assert r["top_probability"] == pytest.approx(brute_force_probability(tree), rel=1e-12)


def test_not_gate_gives_prime_implicants_with_consensus() -> None:
    # TOP = A.~B + B.C: prime implicants A.~B, B.C and their consensus A.C.
    tree: Tree = {
        "top": "TOP",
        "gates": [
            {"id": "TOP", "type": "OR", "inputs": ["G1", "G2"]},
            {"id": "G1", "type": "AND", "inputs": ["A", "NB"]},
            {"id": "NB", "type": "NOT", "inputs": ["B"]},
            {"id": "G2", "type": "AND", "inputs": ["B", "C"]},
        ],
        "basic_events": _events({"A": 0.1, "B": 0.2, "C": 0.3}),
    }
    r = analyze_fault_tree(tree)
    assert r["ok"], r["errors"]
    assert r["coherent"] is False and r["cut_set_kind"] == "prime_implicants"
    assert r["minimal_cut_sets"] == [["A", "NOT B"], ["A", "C"], ["B", "C"]]  # sorted by id
    assert r["minimal_cut_sets"] == brute_force_prime_implicants(tree)
    assert r["top_probability"] == pytest.approx(0.1 * 0.8 + 0.2 * 0.3, rel=1e-12)
    assert r["rare_event_approximation"] is None
    assert any("non-coherent" in w["message"] for w in r["warnings"])


def test_double_negation_is_coherent_and_precise() -> None:
    tree: Tree = {
        "top": "TOP",
        "gates": [
            {"id": "TOP", "type": "AND", "inputs": ["N1", "B"]},
            {"id": "N1", "type": "NOT", "inputs": ["N2"]},
            {"id": "N2", "type": "NOT", "inputs": ["A"]},
        ],
        "basic_events": _events({"A": 1e-12, "B": 3e-9}),
    }
    r = analyze_fault_tree(tree)
    assert r["coherent"] is True and r["minimal_cut_sets"] == [["A", "B"]]
    # Complemented BDD edges must not cost relative precision on tiny probabilities.
    assert r["top_probability"] == pytest.approx(3e-21, rel=1e-12)


def test_contradiction_and_tautology() -> None:
    gates = [{"id": "TOP", "type": "AND", "inputs": ["A", "NA"]},
             {"id": "NA", "type": "NOT", "inputs": ["A"]}]
    r = analyze_fault_tree({"top": "TOP", "gates": gates, "basic_events": _events({"A": .3})})
    assert r["ok"] and r["minimal_cut_sets"] == [] and r["top_probability"] == 0.0
    assert any("never occur" in w["message"] for w in r["warnings"])
    gates[0]["type"] = "OR"
    r = analyze_fault_tree({"top": "TOP", "gates": gates, "basic_events": _events({"A": .3})})
    assert r["minimal_cut_sets"] == [[]] and r["top_probability"] == 1.0


def test_failure_rate_conversion() -> None:
    tree: Tree = {
        "top": "TOP", "mission_time_h": 1000,
        "gates": [{"id": "TOP", "type": "OR", "inputs": ["LEAK", "PUMP"]}],
        "basic_events": [{"id": "LEAK", "failure_rate": 1e-4}, {"id": "PUMP", "probability": 0.0}],
    }
    r = analyze_fault_tree(tree)
    assert r["ok"] and r["warnings"] == []
    assert r["basic_event_probabilities"]["LEAK"] == pytest.approx(1 - math.exp(-0.1), rel=1e-14)
    assert r["top_probability"] == pytest.approx(1 - math.exp(-0.1), rel=1e-14)
    del tree["mission_time_h"]  # default: 8760 h, with a warning
    r = analyze_fault_tree(tree)
    assert r["top_probability"] == pytest.approx(1 - math.exp(-0.876), rel=1e-14)
    assert _paths(r["warnings"]) == ["mission_time_h"]


def test_shared_event_is_exact_not_independent_gates() -> None:
    # TOP = (A + B)(A + C) = A + B.C; A feeds both gates.
    tree: Tree = {
        "top": "TOP",
        "gates": [
            {"id": "TOP", "type": "AND", "inputs": ["G1", "G2"]},
            {"id": "G1", "type": "OR", "inputs": ["A", "B"]},
            {"id": "G2", "type": "OR", "inputs": ["A", "C"]},
        ],
        "basic_events": _events({"A": 0.1, "B": 0.2, "C": 0.3}),
    }
    r = analyze_fault_tree(tree)
    assert r["minimal_cut_sets"] == [["A"], ["B", "C"]]
    exact = 0.1 + 0.9 * 0.2 * 0.3  # 0.154
    naive = (1 - 0.9 * 0.8) * (1 - 0.9 * 0.7)  # gates treated as independent: 0.1036
    assert r["top_probability"] == pytest.approx(exact, rel=1e-12)
    assert r["top_probability"] == pytest.approx(brute_force_probability(tree), rel=1e-12)
    assert abs(r["top_probability"] - naive) > 0.04


def _random_tree(rng: random.Random, n_events: int, n_gates: int, allow_not: bool) -> Tree:
    events = [f"E{i}" for i in range(n_events)]
    gates: list[dict[str, Any]] = []
    pool = list(events)
    kinds = ["AND", "OR", "ATLEAST", "INHIBIT"] + (["NOT"] if allow_not else [])
    for j in range(n_gates):
        kind = rng.choice(kinds)
        gid = f"G{j}"
        if kind in ("NOT", "INHIBIT"):
            g: dict[str, Any] = {"id": gid, "type": kind, "inputs": [rng.choice(pool)]}
            if kind == "INHIBIT":
                g["condition"] = rng.choice(events)
        else:
            ins = rng.sample(pool, rng.randint(2, min(4, len(pool))))
            g = {"id": gid, "type": kind, "inputs": ins}
            if kind == "ATLEAST":
                g["k"] = rng.randint(1, len(ins))
        gates.append(g)
        pool.append(gid)
    top = {"id": "TOP", "type": "OR", "inputs": [f"G{n_gates - 1}", f"G{n_gates - 2}"]}
    by_id = {g["id"]: g for g in gates}
    under, todo = set(), list(top["inputs"])   # a gate the top does not reach is an error
    while todo:
        if (gid := todo.pop()) in by_id and gid not in under:
            under.add(gid)
            todo += by_id[gid]["inputs"]
    return {"top": "TOP", "gates": [top, *(g for g in gates if g["id"] in under)],
            "basic_events": _events({e: round(rng.uniform(0.01, 0.6), 3) for e in events})}


@pytest.mark.parametrize("allow_not", [False, True])
def test_random_trees_match_brute_force(allow_not: bool) -> None:
    rng = random.Random(7 + allow_not)
    for _ in range(20):
        tree = _random_tree(rng, n_events=6, n_gates=7, allow_not=allow_not)
        r = analyze_fault_tree(tree)
        assert r["top_probability"] == pytest.approx(brute_force_probability(tree),
                                                     rel=1e-9, abs=1e-15), tree
        assert r["minimal_cut_sets"] == brute_force_prime_implicants(tree), tree
        assert r["cut_sets_complete"] is True
        negated = any(lit.startswith("NOT ") for cs in r["minimal_cut_sets"] for lit in cs)
        assert r["coherent"] is not negated
        if r["coherent"]:
            rare = sum(math.prod(r["basic_event_probabilities"][e] for e in cs)
                       for cs in r["minimal_cut_sets"])
            assert r["rare_event_approximation"] == pytest.approx(rare, rel=1e-12)


@pytest.mark.parametrize("allow_not", [False, True])
def test_order_bound_lists_exactly_the_short_ones_and_knows_it(allow_not: bool) -> None:
    rng = random.Random(11 + allow_not)
    for _ in range(20):
        tree = _random_tree(rng, n_events=6, n_gates=7, allow_not=allow_not)
        everything = brute_force_prime_implicants(tree)
        r = analyze_fault_tree(tree, max_order=2)
        assert r["minimal_cut_sets"] == [cs for cs in everything if len(cs) <= 2], tree
        assert r["cut_sets_complete"] is all(len(cs) <= 2 for cs in everything), tree


# ---------------------------------------------------------------------------------------------
# Errors and warnings


def _tree(**changes: Any) -> Tree:
    tree: Tree = {
        "top": "TOP",
        "gates": [
            {"id": "TOP", "type": "OR", "inputs": ["G1", "C"]},
            {"id": "G1", "type": "AND", "inputs": ["A", "B"]},
        ],
        "basic_events": _events({"A": 0.1, "B": 0.2, "C": 0.3}),
    }
    tree.update(changes)
    return tree


def _assert_error(r: dict[str, Any], path: str, *words: str) -> None:
    assert not r["ok"]
    assert r["minimal_cut_sets"] is None and r["top_probability"] is None
    assert r["rare_event_approximation"] is None
    hits = [e for e in r["errors"] if e["path"] == path]
    assert hits, r["errors"]
    for word in words:
        assert any(word in e["message"] for e in hits), (word, hits)


def test_cycle_reports_path() -> None:
    tree = _tree()
    tree["gates"][1]["inputs"] = ["A", "G2"]
    tree["gates"].append({"id": "G2", "type": "OR", "inputs": ["B", "G1"]})
    r = analyze_fault_tree(tree)
    _assert_error(r, "gates[2].inputs[1]", "cycle: G1 -> G2 -> G1")
    assert len(r["errors"]) == 1
    # A self-loop too.
    tree = _tree()
    tree["gates"][1]["inputs"] = ["A", "G1"]
    _assert_error(analyze_fault_tree(tree), "gates[1].inputs[1]", "cycle: G1 -> G1")


def test_dangling_references() -> None:
    tree = _tree()
    tree["gates"][1]["inputs"] = ["A", "B_TYPO"]
    _assert_error(analyze_fault_tree(tree), "gates[1].inputs[1]", "B_TYPO")
    tree = _tree()
    tree["gates"].append({"id": "G3", "type": "INHIBIT", "inputs": ["A"], "condition": "NOPE"})
    tree["gates"][0]["inputs"].append("G3")
    _assert_error(analyze_fault_tree(tree), "gates[2].condition", "NOPE")


def test_atleast_k_out_of_range() -> None:
    tree = _tree()
    tree["gates"][1] = {"id": "G1", "type": "ATLEAST", "k": 3, "inputs": ["A", "B"]}
    _assert_error(analyze_fault_tree(tree), "gates[1].k", "k = 3", "2 inputs")
    tree["gates"][1]["k"] = 0
    _assert_error(analyze_fault_tree(tree), "gates[1].k", "k = 0")
    del tree["gates"][1]["k"]
    _assert_error(analyze_fault_tree(tree), "gates[1].k", "integer k")


def test_duplicate_ids_also_across_gates_and_events() -> None:
    tree = _tree()
    tree["basic_events"].append({"id": "G1", "probability": 0.5})
    _assert_error(analyze_fault_tree(tree), "basic_events[3].id", "duplicate id 'G1'",
                  "gates[1]")
    tree = _tree()
    tree["gates"].append({"id": "TOP", "type": "AND", "inputs": ["A", "B"]})
    _assert_error(analyze_fault_tree(tree), "gates[2].id", "duplicate id 'TOP'")


def test_undefined_top() -> None:
    _assert_error(analyze_fault_tree(_tree(top="G_MISSING")), "top", "G_MISSING")


@pytest.mark.parametrize(("gate", "path", "word"), [
    ({"id": "G1", "type": "AND", "inputs": ["A"]}, "gates[1].inputs", "at least 2"),
    ({"id": "G1", "type": "OR", "inputs": ["A"]}, "gates[1].inputs", "at least 2"),
    ({"id": "G1", "type": "NOT", "inputs": ["A", "B"]}, "gates[1].inputs", "exactly 1"),
    ({"id": "G1", "type": "INHIBIT", "inputs": ["A", "B"], "condition": "C"},
     "gates[1].inputs", "exactly 1"),
    ({"id": "G1", "type": "INHIBIT", "inputs": ["A"]}, "gates[1].condition", "needs a condition"),
    ({"id": "G1", "type": "INHIBIT", "inputs": ["A"], "condition": "TOP"},
     "gates[1].condition", "is a gate"),
    ({"id": "G1", "type": "XOR", "inputs": ["A", "B"]}, "gates[1].type", "unknown gate type"),
])
def test_wrong_gate_shapes(gate: dict[str, Any], path: str, word: str) -> None:
    tree = _tree()
    tree["gates"][1] = gate
    _assert_error(analyze_fault_tree(tree), path, word)


@pytest.mark.parametrize(("event", "path", "word"), [
    ({"id": "C", "probability": 1.5}, "basic_events[2].probability", "[0, 1]"),
    ({"id": "C", "probability": -0.1}, "basic_events[2].probability", "[0, 1]"),
    ({"id": "C", "probability": float("nan")}, "basic_events[2].probability", "[0, 1]"),
    ({"id": "C", "failure_rate": -1e-6}, "basic_events[2].failure_rate", ">= 0"),
    ({"id": "C"}, "basic_events[2]", "neither"),
    ({"id": "C", "probability": 0.1, "failure_rate": 1e-6}, "basic_events[2]", "both"),
])
def test_bad_basic_events(event: dict[str, Any], path: str, word: str) -> None:
    tree = _tree()
    tree["basic_events"][2] = event
    r = analyze_fault_tree(tree)
    _assert_error(r, path, word)
    assert "C" not in r["basic_event_probabilities"] and r["basic_event_probabilities"]["A"] == .1


def test_bad_mission_time() -> None:
    _assert_error(analyze_fault_tree(_tree(mission_time_h=0)), "mission_time_h", "positive")


def test_evidence_point_must_be_known_when_points_given() -> None:
    tree = _tree()
    tree["basic_events"][1]["evidence"] = {"point": "pump_b_current", "observation": "0 A"}
    assert analyze_fault_tree(tree)["ok"]  # no point list: not checked
    assert analyze_fault_tree(tree, known_points={"pump_b_current"})["ok"]
    r = analyze_fault_tree(tree, known_points=["pump_a_current"])
    _assert_error(r, "basic_events[1].evidence.point", "pump_b_current")


def test_unreachable_gate_is_an_error_unreachable_event_a_warning() -> None:
    tree = _tree()
    tree["basic_events"] += _events({"D": 0.5, "E": 0.5})
    r = analyze_fault_tree(tree)
    assert r["ok"] and r["errors"] == []
    assert _paths(r["warnings"]) == ["basic_events[3]", "basic_events[4]"]
    assert r["minimal_cut_sets"] == [["C"], ["A", "B"]]
    assert r["top_probability"] == pytest.approx(1 - 0.98 * 0.7, rel=1e-12)
    # the demo model's answer for "Conveyor stops on drive overload": a gate written but
    # named by no gate under the top (its subtree is lost to the analysis)
    tree["gates"].append({"id": "G_ORPHAN", "type": "OR", "inputs": ["A", "D"]})
    _assert_error(analyze_fault_tree(tree), "gates[2]", "'G_ORPHAN' is not reachable")


def test_basic_event_named_like_a_gate_is_an_error_when_told_the_prefix() -> None:
    tree = _tree()
    tree["gates"][0]["inputs"] = ["G1", "G_LOAD"]
    tree["basic_events"][2]["id"] = "G_LOAD"
    assert analyze_fault_tree(tree)["ok"]   # a prefix is the task's convention, not the tool's
    r = analyze_fault_tree(tree, gate_prefix="G_")
    _assert_error(r, "basic_events[2].id", "'G_LOAD' is named like a gate")
    assert analyze_fault_tree(_tree(), gate_prefix="G_")["ok"]  # gates may be named otherwise


@pytest.mark.parametrize(("observation", "point", "word"), [
    ("42.5 A", None, None),
    ("42.5 A, above normal 36-44", None, None),
    ("42.50 A", None, None),                      # the same within what is written
    ("42 A", None, None),                         # rounded to what is written
    ("42.5A: high", None, None),
    ("59.0 A", None, "quotes 59.0, the point reads 42.5"),
    ("59.0 A, above normal 36-44", None, "quotes 59.0"),
    ("41 A", None, "quotes 41"),
    ("42.5 V", None, "unit is not 'A'"),
    ("42.5 Amps", None, "unit is not 'A'"),
    ("high current", None, "must start with the reading '42.5 A'"),
    ("", None, "must start with the reading"),
    ("1e-05 bar", {"value": 1e-05, "unit": "bar"}, None),
    ("0.00002 bar", {"value": 1e-05, "unit": "bar"}, "quotes 0.00002"),
    ("1480", {"value": 1480}, None),
    ("1480 rpm, nominal", {"value": 1480}, None),   # no unit given: only the number
    ("True, running", {"value": True}, None),
    ("true", {"value": True}, None),
    ("False", {"value": True}, "must start with the reading 'True'"),
    ("anything", {"value": None}, None),           # no reading: nothing to quote
])
def test_evidence_quotes_the_points_reading(observation: str, point: dict[str, Any] | None,
                                            word: str | None) -> None:
    tree = _tree()
    tree["basic_events"][1]["evidence"] = {"point": "current", "observation": observation}
    current = {"name": "current", **(point or {"value": 42.5, "unit": "A"})}
    assert analyze_fault_tree(tree, known_points=["current"])["ok"]   # no readings: not checked
    r = analyze_fault_tree(tree, known_points=["current"], points={"current": current})
    if word is None:
        assert r["ok"], r["errors"]
    else:
        _assert_error(r, "basic_events[1].evidence.observation", word)


def test_several_errors_at_once() -> None:
    tree = _tree(top="NOPE")
    tree["gates"][1]["inputs"] = ["A", "X"]
    tree["basic_events"][0]["probability"] = 2
    r = analyze_fault_tree(tree)
    assert sorted(_paths(r["errors"])) == ["basic_events[0].probability", "gates[1].inputs[1]",
                                           "top"]


# ---------------------------------------------------------------------------------------------
# Bounds on enumeration


def _and_of_ors(n_or: int, width: int, extra: list[str] | None = None) -> Tree:
    gates: list[dict[str, Any]] = [
        {"id": f"O{i}", "type": "OR", "inputs": [f"E{i}_{j}" for j in range(width)]}
        for i in range(n_or)]
    gates.insert(0, {"id": "G_AND", "type": "AND", "inputs": [g["id"] for g in gates]})
    events = {f"E{i}_{j}": 0.01 for i in range(n_or) for j in range(width)}
    top = "G_AND"
    if extra:
        gates.insert(0, {"id": "TOP", "type": "OR", "inputs": ["G_AND", *extra]})
        events.update(dict.fromkeys(extra, 0.001))
        top = "TOP"
    return {"top": top, "gates": gates, "basic_events": _events(events)}


def test_order_bound_leaves_long_cut_sets_out_with_a_warning() -> None:
    tree: Tree = {"top": "TOP",
                  "gates": [{"id": "TOP", "type": "OR", "inputs": ["G9", "X"]},
                            {"id": "G9", "type": "AND", "inputs": [f"E{i}" for i in range(9)]}],
                  "basic_events": _events({"X": 0.01, **{f"E{i}": 0.5 for i in range(9)}})}
    r = analyze_fault_tree(tree)
    assert r["ok"] and r["minimal_cut_sets"] == [["X"]] and r["cut_sets_complete"] is False
    assert any("more than 8 events" in w["message"] for w in r["warnings"])
    assert r["top_probability"] == pytest.approx(1 - 0.99 * (1 - 0.5**9), rel=1e-12)
    r = analyze_fault_tree(tree, max_order=9)
    assert len(r["minimal_cut_sets"]) == 2 and r["cut_sets_complete"] is True


def test_count_bound_falls_back_to_lower_order() -> None:
    tree = _and_of_ors(3, 5, extra=["X", "Y"])  # 2 single events + 125 sets of order 3
    full = analyze_fault_tree(tree)
    assert len(full["minimal_cut_sets"]) == 127 and full["cut_sets_complete"] is True
    r = analyze_fault_tree(tree, max_cut_sets=100)
    assert r["minimal_cut_sets"] == [["X"], ["Y"]] and r["cut_sets_complete"] is False
    assert any("more than 100" in w["message"] for w in r["warnings"])
    assert r["top_probability"] == full["top_probability"]
    assert r["rare_event_approximation"] == pytest.approx(0.002, rel=1e-12)


def test_parity_tree_has_only_long_prime_implicants() -> None:
    # E0 xor E1 xor ... xor E9: 2^9 prime implicants, each of all 10 events.
    gates: list[dict[str, Any]] = []
    prev = "E0"
    for i in range(1, 10):
        gates += [
            {"id": f"NP{i}", "type": "NOT", "inputs": [prev]},
            {"id": f"NE{i}", "type": "NOT", "inputs": [f"E{i}"]},
            {"id": f"A{i}", "type": "AND", "inputs": [prev, f"NE{i}"]},
            {"id": f"B{i}", "type": "AND", "inputs": [f"NP{i}", f"E{i}"]},
            {"id": f"X{i}", "type": "OR", "inputs": [f"A{i}", f"B{i}"]},
        ]
        prev = f"X{i}"
    tree = {"top": prev, "gates": gates,
            "basic_events": _events({f"E{i}": 0.1 for i in range(10)})}
    r = analyze_fault_tree(tree)
    assert r["coherent"] is False and r["minimal_cut_sets"] == []
    assert r["cut_sets_complete"] is False
    assert r["top_probability"] == pytest.approx((1 - 0.8**10) / 2, rel=1e-12)
    r = analyze_fault_tree(tree, max_order=10)
    assert len(r["minimal_cut_sets"]) == 512 and r["cut_sets_complete"] is True
    assert r["minimal_cut_sets"][0] == [f"E{i}" for i in range(9)] + ["NOT E9"]


def test_default_bound_does_not_hang() -> None:
    tree = _and_of_ors(6, 5)  # 5^6 = 15,625 minimal cut sets of order 6
    r = analyze_fault_tree(tree)
    assert r["ok"] and r["cut_sets_complete"] is False and r["minimal_cut_sets"] == []
    assert any("more than 10000" in w["message"] for w in r["warnings"])
    assert r["top_probability"] == pytest.approx((1 - 0.99**5) ** 6, rel=1e-12)
