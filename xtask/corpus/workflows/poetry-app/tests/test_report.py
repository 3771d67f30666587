from poetry_app import report


def test_report_reads_the_real_files():
    found = report()
    assert found["env_keys"] >= 1 and found["aws_profiles"] >= 1
