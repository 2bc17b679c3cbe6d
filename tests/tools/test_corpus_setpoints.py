"""The corpus's ST answers in the form rung serves them (tools/corpus_st_setpoints.py): the
answer starts with what code writes for the request (interface, then a setpoint per stated
value), the body reads each setpoint and never assigns it, and the answer passes its checks."""

from __future__ import annotations

import json
import random
from collections import Counter

from rung.daemon.tasks.st import request as st_request
from rung.daemon.tasks.task import load_tasks
from rung.daemon.tasks.validate import validate_output
from rung.tools.corpus_st import ARCHETYPES, st_sample
from rung.tools.corpus_st_setpoints import in_served_form


def test_samples_start_as_rung_writes_them_and_read_every_setpoint() -> None:
    st = load_tasks()["st_code"]
    with_setpoints = Counter[str]()
    for name in sorted(ARCHETYPES):
        rng = random.Random(11)
        for _ in range(6):
            data, output = st_sample(rng, name)
            prefix = st.kind.shape(st.output_schema, data).prefix
            text = json.dumps(output, separators=(",", ":"), ensure_ascii=False)
            assert text.startswith(prefix), (name, prefix, text[:300])
            _, setpoints = st_request.declared(data)
            if not setpoints:
                continue
            with_setpoints[name] += 1
            body = output["body"]
            for sp in setpoints:
                assert sp in output["variables"]
                assert st_request.values_used(st_request.read(data), output)["ok"], name
                assert f"{sp['name']} :=" not in body, (name, body)
            ok, v = validate_output(st.output_schema, st.kind, output, data)
            assert ok, (name, v)
    # most archetypes that state values are served with setpoints
    assert len(with_setpoints) >= 15, with_setpoints


def test_a_threshold_variable_becomes_the_setpoint_and_a_literal_its_name() -> None:
    data = {"description": "Pump on above 70 % and off below 30 %; alarm after 5 s.",
            "name": "FB_P", "pou_type": "FUNCTION_BLOCK",
            "constraints": ["VAR_INPUT rLevel : REAL", "VAR_OUTPUT bPump : BOOL, bAlarm : BOOL"]}
    output = {"pou_type": "FUNCTION_BLOCK", "name": "FB_P", "variables": [
        {"section": "VAR_INPUT", "name": "rLevel", "type": "REAL"},
        {"section": "VAR_OUTPUT", "name": "bPump", "type": "BOOL"},
        {"section": "VAR_OUTPUT", "name": "bAlarm", "type": "BOOL"},
        {"section": "VAR", "name": "rHigh", "type": "REAL", "initial": "70.0"},
        {"section": "VAR", "name": "tmr", "type": "TON"}],
        "body": "IF rLevel > rHigh THEN bPump := TRUE; ELSIF rLevel < 30.0 THEN bPump := "
                "FALSE; END_IF; // 30.0 is the stop level\ntmr(IN := bPump, PT := T#5S);\n"
                "bAlarm := tmr.Q;"}
    served = in_served_form(data, output)
    assert served is not None
    names = [v["name"] for v in st_request.declared(data)[1]]
    assert [v["name"] for v in served["variables"]] == [
        "rLevel", "bPump", "bAlarm", *names, "tmr"]
    on, off, delay = names
    assert served["body"] == (f"IF rLevel > {on} THEN bPump := TRUE; ELSIF rLevel < {off} "
                              "THEN bPump := FALSE; END_IF; // 30.0 is the stop level\n"
                              f"tmr(IN := bPump, PT := {delay});\nbAlarm := tmr.Q;"
                              )
    # a POU that writes 70 % as a fraction cannot be put in that form: drawn again
    fraction = dict(output, variables=output["variables"][:3] + output["variables"][4:],
                    body=output["body"].replace("rHigh", "0.7 * 100.0"))
    assert in_served_form(data, fraction) is None
    # nor one that assigns the variable holding a stated value
    assigned = dict(output, body=output["body"] + " rHigh := 60.0;")
    assert in_served_form(data, assigned) is None
