"""PLCopen TC6 XML 2.01: documents valid against the official schema, read back to the same
POU object, for both editions; what cannot be carried is refused; ``rung generate
--plcopen`` on the demo model."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import xmlschema

from rung.daemon.cli import main
from rung.daemon.plant.plcopen import PlcopenError, from_plcopen_xml, to_plcopen_xml
from rung.daemon.tasks.st.edition import EditionError, edition_problems, to_edition
from rung.tools.corpus_st import ARCHETYPES, st_sample
from tests.daemon.tasks.st.test_pou import GOOD, var

XSD = Path(__file__).resolve().parents[2] / "data" / "tc6_xml_v201.xsd"


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(XSD)


def _corpus() -> list[dict[str, Any]]:
    rng = random.Random(2013)
    return [st_sample(rng, name)[1] for name in sorted(ARCHETYPES) for _ in range(5)]


POUS = [*GOOD.values(), *_corpus()]


@pytest.mark.parametrize("edition", [2, 3])
@pytest.mark.slow
def test_round_trip_over_the_repository_pous(schema: xmlschema.XMLSchema, edition: int) -> None:
    for pou in POUS:
        text = to_plcopen_xml(pou, edition)
        schema.validate(text)
        want = {**pou, "body": to_edition(pou["body"], edition)}
        assert from_plcopen_xml(text) == want
        if edition == 2:
            assert edition_problems(from_plcopen_xml(text)["body"], 2) == []
    assert any("//" in p["body"] for p in POUS)  # edition 2 had comments to rewrite


def test_the_document_has_the_parts_importers_read(schema: xmlschema.XMLSchema) -> None:
    doc = schema.to_dict(to_plcopen_xml(GOOD["scale"], 3, project_name="Press line 3"))
    header = doc["fileHeader"]
    assert {"@companyName", "@productName", "@productVersion", "@creationDateTime"} <= set(
        header)
    assert doc["contentHeader"]["@name"] == "Press line 3"
    (pou,) = doc["types"]["pous"]["pou"]
    assert pou["@name"] == "F_Scale" and pou["@pouType"] == "function"
    iface = pou["interface"]
    assert "REAL" in iface["returnType"]
    assert [v["@name"] for v in iface["inputVars"][0]["variable"]] == [
        "raw", "rawMin", "rawMax", "engMin", "engMax"]
    assert iface["localVars"][0]["variable"][0]["@name"] == "span"
    text = to_plcopen_xml(GOOD["scale"], 3)
    assert "<body><ST><xhtml:p><![CDATA[span := INT_TO_REAL(rawMax - rawMin);" in text
    motor = to_plcopen_xml(GOOD["motor"], 3)
    assert ('<variable name="startDelay"><type><derived name="TON"/></type></variable>'
            in motor)
    assert ('<variable name="guardClosed"><type><BOOL/></type><documentation><xhtml:p>'
            'safety interlock</xhtml:p></documentation></variable>' in motor)
    assert "<xhtml:p>Written by rung (st_code task), IEC 61131-3 edition 3.\nAssumptions:\n" \
           "- stop is wired normally closed</xhtml:p>" in motor


TYPES = [("STRING[20]", '<string length="20"/>'), ("WSTRING", "<wstring/>"),
         ("TIME_OF_DAY", "<TOD/>"), ("DATE_AND_TIME", "<DT/>"), ("LWORD", "<LWORD/>"),
         ("ARRAY[-5..5] OF LREAL",
          '<array><dimension lower="-5" upper="5"/><baseType><LREAL/></baseType></array>'),
         ("ARRAY[1..2, 0..3] OF INT",
          '<array><dimension lower="1" upper="2"/><dimension lower="0" upper="3"/>'
          '<baseType><INT/></baseType></array>'),
         ("CTUD", '<derived name="CTUD"/>'), ("MyRecipe", '<derived name="MyRecipe"/>')]


@pytest.mark.parametrize("type_,element", TYPES)
def test_types(schema: xmlschema.XMLSchema, type_: str, element: str) -> None:
    pou = {"pou_type": "PROGRAM", "name": "P_Types", "body": "x := x;",
           "variables": [var("VAR", "x", type_)]}
    text = to_plcopen_xml(pou)
    schema.validate(text)
    assert f"<type>{element}</type>" in text
    assert from_plcopen_xml(text) == pou


def test_sections_keep_the_object_order_and_awkward_text_survives(
        schema: xmlschema.XMLSchema) -> None:
    pou = {"pou_type": "FUNCTION_BLOCK", "name": "FB_Mixed",
           "variables": [var("VAR", "n", "INT", "0", "count <of> \"things\" & more"),
                         var("VAR_INPUT", "go", "BOOL", comment="tab\there"),
                         var("VAR_OUTPUT", "done", "BOOL"),
                         var("VAR_INPUT", "label", "STRING[8]", "'a]]>b'"),
                         var("VAR_TEMP", "t", "TIME", "T#1s"),
                         var("VAR_IN_OUT", "total", "DINT")],
           "body": "IF go THEN // ]]> in a comment\r\n    n := n + 1;\r\nEND_IF;\n"
                   "label := 'x]]>y';\ndone := n > 3 AND total < 10;",
           "assumptions": ["one", "two <b> & 'three'", "line\nbreak"]}
    for edition in (2, 3):
        text = to_plcopen_xml(pou, edition)
        schema.validate(text)
        assert from_plcopen_xml(text) == {**pou, "body": to_edition(pou["body"], edition)}
    assert "<inputVars>" in text and text.count("<inputVars>") == 2


def test_blank_initial_and_comment_are_left_out_and_empty_assumptions_kept(
        schema: xmlschema.XMLSchema) -> None:
    pou = {"pou_type": "PROGRAM", "name": "P_Blank", "body": "x := TRUE;",
           "variables": [var("VAR", "x", "BOOL", " ", "")], "assumptions": []}
    text = to_plcopen_xml(pou)
    schema.validate(text)
    assert "initialValue" not in text and "<xhtml:p></xhtml:p>" not in text
    assert from_plcopen_xml(text) == {**pou, "variables": [var("VAR", "x", "BOOL")]}


@pytest.mark.parametrize("change,message", [
    ({"pou_type": "CLASS"}, "pou_type 'CLASS' is not one of"),
    ({"name": "1st"}, "name: '1st' is not an IEC identifier"),
    ({"variables": [var("VAR_GLOBAL", "g", "INT")]}, r"variables\[0\]: needs a section"),
    ({"variables": [var("VAR", "x", "LTIME")]}, "type 'LTIME' has no PLCopen TC6 2.01 form"),
    ({"variables": [var("VAR", "x", "ARRAY[1..n] OF INT")]}, "array bounds '1..n'"),
    ({"variables": [var("VAR", "x y", "INT")]}, r"variables\[0\]\.name"),
    ({"body": "x := 1;\x01"}, "body: character U\\+0001 cannot be written in XML"),
    ({"variables": [var("VAR", "x", "INT", comment="\x1b[0m")]}, r"variables\[0\]\.comment"),
])
def test_what_the_document_cannot_carry_is_refused(change: dict[str, Any],
                                                   message: str) -> None:
    pou = {**copy.deepcopy(GOOD["motor"]), **change}
    with pytest.raises(PlcopenError, match=message):
        to_plcopen_xml(pou)


def test_unknown_edition_is_refused() -> None:
    with pytest.raises(EditionError):
        to_plcopen_xml(GOOD["motor"], 1)


# --- reading documents written elsewhere ---------------------------------------------------

FOREIGN = """<?xml version="1.0" encoding="utf-8"?>
<project xmlns="http://www.plcopen.org/xml/tc6_0201" xmlns:xhtml="http://www.w3.org/1999/xhtml">
  <fileHeader companyName="Acme" productName="IDE" productVersion="1"
              creationDateTime="2024-01-01T00:00:00"/>
  <contentHeader name="line3">
    <coordinateInfo>
      <fbd><scaling x="0" y="0"/></fbd><ld><scaling x="0" y="0"/></ld>
      <sfc><scaling x="0" y="0"/></sfc>
    </coordinateInfo>
  </contentHeader>
  <types>
    <dataTypes/>
    <pous>
      <pou name="FB_Fill" pouType="functionBlock">
        <interface>
          <inputVars>
            <variable name="levels">
              <type>
                <array><dimension lower="1" upper="4"/><baseType><REAL/></baseType></array>
              </type>
              <initialValue><arrayValue>
                <value repetitionValue="3"><simpleValue value="0.0"/></value>
                <value><simpleValue value="1.5"/></value>
              </arrayValue></initialValue>
              <documentation>
                <xhtml:p><![CDATA[tank levels in m]]></xhtml:p>
              </documentation>
            </variable>
          </inputVars>
          <outputVars><variable name="pump"><type><BOOL/></type></variable></outputVars>
        </interface>
        <body>
          <ST>
            <xhtml:p><![CDATA[pump := levels[1] < 1.0;]]></xhtml:p>
          </ST>
        </body>
        %s
      </pou>
      %s
    </pous>
  </types>
  <instances><configurations/></instances>
</project>
"""


def test_a_document_from_an_ide_is_read(schema: xmlschema.XMLSchema) -> None:
    text = FOREIGN % ("", "")
    schema.validate(text)
    assert from_plcopen_xml(text) == {
        "pou_type": "FUNCTION_BLOCK", "name": "FB_Fill",
        "variables": [{"section": "VAR_INPUT", "name": "levels",
                       "type": "ARRAY[1..4] OF REAL", "initial": "[3(0.0), 1.5]",
                       "comment": "tank levels in m"},
                      {"section": "VAR_OUTPUT", "name": "pump", "type": "BOOL"}],
        "body": "pump := levels[1] < 1.0;"}


LADDER = ('<pou name="P_Ladder" pouType="program"><body><LD/></body></pou>')


@pytest.mark.parametrize("text,message", [
    ("not xml", "not an XML document"),
    ('<project xmlns="http://www.plcopen.org/xml/tc6.xsd"/>', "not a PLCopen TC6 2.01 project"),
    (FOREIGN % ("", LADDER), r"holds 2 POUs \(POUs: FB_Fill, P_Ladder\)"),
    (FOREIGN.replace("<inputVars>", '<inputVars constant="true">') % ("", ""),
     "VAR_INPUT CONSTANT has no place"),
    (FOREIGN.replace("inputVars>", "externalVars>") % ("", ""), "<externalVars> has no place"),
    (FOREIGN.replace('pouType="functionBlock"', 'pouType="class"') % ("", ""),
     "pouType 'class'"),
])
def test_what_rung_cannot_read_is_refused(text: str, message: str) -> None:
    with pytest.raises(PlcopenError, match=message):
        from_plcopen_xml(text)


def test_one_pou_is_picked_by_name(schema: xmlschema.XMLSchema) -> None:
    text = FOREIGN % ("", LADDER)
    schema.validate(text)
    assert from_plcopen_xml(text, name="FB_Fill")["name"] == "FB_Fill"
    with pytest.raises(PlcopenError, match="has a LD body: rung reads Structured Text only"):
        from_plcopen_xml(text, name="P_Ladder")
    with pytest.raises(PlcopenError, match="holds 0 POUs named 'P_None'"):
        from_plcopen_xml(text, name="P_None")


def test_the_serving_path_does_not_import_a_schema_validator() -> None:
    code = ("import sys\nfrom rung.daemon.plant.plcopen import to_plcopen_xml, from_plcopen_xml\n"
            "from tests.daemon.tasks.st.test_pou import GOOD\n"
            "from_plcopen_xml(to_plcopen_xml(GOOD['motor'], 2))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('xmlschema', 'elementpath', 'lxml')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


# --- rung generate --plcopen ----------------------------------------------------------------

MOTOR_INPUT = json.dumps({"description": "Motor start/stop with a guard door interlock and "
                                         "overload trip"})


@pytest.mark.integration
def test_generate_writes_the_answer_as_plcopen(edge_engine: Path, tmp_path: Path,
                                               schema: xmlschema.XMLSchema,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "motor.xml"
    assert main(["generate", str(edge_engine), "--task", "st_code", "--input", MOTOR_INPUT,
                 "--plcopen", str(out), "--st-edition", "2", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["ok"] and captured.err == ""
    text = out.read_text(encoding="utf-8")
    schema.validate(text)
    assert "IEC 61131-3 edition 2" in text
    assert from_plcopen_xml(text) == {**doc["output"],
                                      "body": to_edition(doc["output"]["body"], 2)}
    assert not list(tmp_path.glob(".*.tmp"))
    assert main(["generate", str(edge_engine), "--task", "st_code", "--input", MOTOR_INPUT,
                 "--plcopen", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    assert from_plcopen_xml(out.read_text(encoding="utf-8")) == doc["output"]  # edition 3


@pytest.mark.integration
def test_generate_writes_no_file_for_an_answer_that_is_not_ok(
        edge_engine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "motor.xml"
    assert main(["generate", str(edge_engine), "--task", "st_code", "--input", MOTOR_INPUT,
                 "--plcopen", str(out), "--max-tokens", "8", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["code"] == "truncated"
    assert f"rung: {out} not written: the answer is not ok" in captured.err
    assert not out.exists()


@pytest.mark.integration
@pytest.mark.parametrize("args,message", [
    (["--prompt", "hi"], "--plcopen writes the POU of a task's answer (use --task st_code)"),
    (["--task", "diagnosis", "--input", "{}"], "task diagnosis does not answer with a POU"),
    (["--task", "st_code", "--input", MOTOR_INPUT, "--st-edition", "4"], "invalid choice"),
])
@pytest.mark.slow
def test_generate_plcopen_usage_errors(edge_engine: Path, tmp_path: Path, args: list[str],
                                       message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "rung.daemon", "generate", str(edge_engine),
                        *args, "--plcopen", str(tmp_path / "x.xml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (1, 2) and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.xml").exists()
