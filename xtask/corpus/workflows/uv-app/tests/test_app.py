import app


def test_report_reads_the_real_files():
    found = app.report()
    assert found["env_keys"] >= 1 and found["aws_profiles"] >= 1
