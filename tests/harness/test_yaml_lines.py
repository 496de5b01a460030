"""Line numbers of YAML keys and values, and the indentation a rewrite keeps."""

from __future__ import annotations

from quantgate.harness.yaml_lines import guess_indent, parse_yaml


def test_a_value_written_below_its_key_has_its_own_line() -> None:
    # An error about the value (a misspelt kernel) points at the value, not at its key.
    doc = parse_yaml("model_name: m\nexpect:\n  linear_kernel:\n    emulaton\n")
    assert doc.line(["expect", "linear_kernel"]) == 3
    assert doc.value_line(["expect", "linear_kernel"]) == 4


def test_the_first_sequence_sets_the_dash_offset_even_at_its_keys_column() -> None:
    # `- ` at the key's column is offset 0: a later, deeper list must not make the rewrite indent
    # every dash of the file.
    assert guess_indent("tasks:\n- name: gsm8k\n  metrics:\n    - name: x\n") == (2, 2, 0)


def test_a_key_inside_a_sequence_item_does_not_set_the_mapping_indent() -> None:
    # Its column is shifted by the dash: `- metrics:` at 0 with its keys at 4 is an indent of 2.
    assert guess_indent("tasks:\n- metrics:\n    x: 1\n") == (2, 2, 0)
