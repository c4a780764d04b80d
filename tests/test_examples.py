"""The small examples run and print what they promise (the main job: test_train_lm.py)."""
import pathlib
import runpy

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / 'examples'


def run(name, capsys):
  runpy.run_path(str(EXAMPLES / name), run_name='__main__')
  return capsys.readouterr().out


def test_quickstart_tour(capsys):
  printed = run('quickstart.py', capsys)
  assert ("variables: {'params': {'hidden': {'bias': (8,), 'kernel': (3, 8)}, "
          "'out': {'bias': (1,), 'kernel': (8, 1)}}, 'stats': {'calls': ()}}") in printed
  # init counted one call, apply one more; the lifted call's update lands outside it.
  assert 'calls after one apply: 2' in printed
  assert 'calls after the lifted call: 2' in printed
  assert 'outputs differ under scaled params: True' in printed


def test_lift_transpose_stores_what_apply_reads(capsys):
  printed = run('lift_transpose.py', capsys)  # its __main__ asserts both round trips
  assert 'one way, init stores the kernel as dense created it: (2, 4)' in printed
  assert 'both ways, init stores the transposed kernel (4, 2)' in printed
  assert printed.rstrip().endswith('apply(init) gives the same output: True')
