"""What every CLI-misuse test asserts: stderr holds exactly one line, in the CLI's error format."""


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bebop: error: ")
    return lines[0]
