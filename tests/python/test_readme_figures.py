"""bench/readme_figures.py: the README's figures section is exactly what the generator writes from the
records in bench/results/, and a figure edited by hand (or a record changed without regenerating) fails."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "readme_figures.py"


def load_generator():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_figures_match_the_records():
    gen = load_generator()
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(gen.BEGIN), readme.index(gen.END) + len(gen.END)
    assert readme[start:end] == gen.figures(), "README.md's figures differ from bench/results/; run " \
                                                "python3 bench/readme_figures.py"
    assert gen.main(["--check"]) == 0


def test_a_figure_edited_by_hand_is_caught(tmp_path, capsys):
    gen = load_generator()
    readme = (ROOT / "README.md").read_text()
    section = gen.figures()
    assert "| uniform, fp32 | 656 µs |" in section  # the TBE forward's uniform fp32 record
    edited = tmp_path / "README.md"
    edited.write_text(readme.replace("| uniform, fp32 | 656 µs |", "| uniform, fp32 | 600 µs |"))
    assert gen.main(["--check", "--readme", str(edited)]) == 1
    assert "differ from bench/results/" in capsys.readouterr().err
    assert gen.main(["--readme", str(edited)]) == 0  # regenerating restores the record's figure
    assert edited.read_text() == readme
