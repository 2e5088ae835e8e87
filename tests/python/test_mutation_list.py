"""Keeps the mutation-testing script's list of planted bugs (scripts/mutants.py) applicable as the sources change: every
mutant's snippet must occur exactly once in its file, ids must be unique and every mutant must lie in
the CPU library (src/core, src/fp8, src/tbe outside their cuda/ folders), src/capi, python/embscale or the CLI
(tools/) (what `python3 scripts/mutation_test.py --list` checks). The
mutation run itself takes hours and is not part of the test suite (docs/mutation_testing.md)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script():
    spec = importlib.util.spec_from_file_location("mutation_test", os.path.join(ROOT, "scripts", "mutation_test.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_mutant_snippet_is_found_exactly_once():
    mt = load_script()
    problems = mt.check_list(ROOT, mt.MUTANTS, verbose=False)
    assert not problems, "scripts/mutants.py no longer matches the sources:\n" + "\n".join(problems)
    folders = {m.folder for m in mt.MUTANTS}
    assert folders == {"src/core", "src/fp8", "src/tbe", "src/capi", "python/embscale", "tools"}
    assert len(mt.MUTANTS) >= 60
