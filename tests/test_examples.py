"""The examples run and print what they promise."""
import pathlib
import runpy

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / 'examples'


@pytest.mark.parametrize('name', ['quickstart.py', 'lift_transpose.py'])
def test_example_runs(name, capsys):
  runpy.run_path(str(EXAMPLES / name), run_name='__main__')
  assert capsys.readouterr().out
