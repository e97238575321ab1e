"""--help, the man page and the README name the same options."""
import os
import re

from harness import SRCDIR, check, main, run


def help_options():
    r = run(["--help"])
    check(r.returncode == 0, "--help failed")
    opts = set(re.findall(r"--([a-z][a-z-]+)", r.stdout))
    check(len(opts) >= 12, f"too few options in --help: {sorted(opts)}")
    return opts


def test_man_page_documents_every_option():
    with open(os.path.join(SRCDIR, "man", "pytorch_exec.1")) as f:
        man = f.read().replace("\\-", "-")
    missing = [o for o in help_options() if f"--{o}" not in man]
    check(not missing, f"options missing from man/pytorch_exec.1: {missing}")


def test_readme_lists_every_option():
    with open(os.path.join(SRCDIR, "README.md")) as f:
        readme = f.read()
    missing = [o for o in help_options() if f"--{o}" not in readme and o not in ("np", "verbose", "x")]
    check(not missing, f"options missing from README.md: {missing}")


def test_man_page_documents_every_worker_variable():
    with open(os.path.join(SRCDIR, "man", "pytorch_exec.1")) as f:
        man = f.read()
    r = run(["-n", "1", "env"])
    names = [l.split("=")[0] for l in r.stdout.splitlines()
             if re.match(r"^(RANK|WORLD_SIZE|LOCAL_|GROUP_|ROLE_|MASTER_|TORCHELASTIC_|OMPI_COMM_WORLD_|"
                         r"PYTORCH_EXEC_)", l)]
    check(len(names) >= 20, f"only {names}")
    missing = [n for n in names if n not in man]
    check(not missing, f"worker variables missing from the man page: {missing}")


if __name__ == "__main__":
    main([test_man_page_documents_every_option, test_readme_lists_every_option,
          test_man_page_documents_every_worker_variable])
