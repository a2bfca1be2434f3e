"""The README's example runs as written."""
import pathlib
import re


def test_readme_check_layer_example_runs(capsys):
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"## Check a pair of your own\s+```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["report"].ok
    assert "scale" in capsys.readouterr().out
