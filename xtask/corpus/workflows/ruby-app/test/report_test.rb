require "minitest/autorun"
require "report"

class ReportTest < Minitest::Test
  def test_reads_the_real_files
    report = Report.new
    assert_operator report.env_keys, :>=, 1
    assert_operator report.aws_profiles, :>=, 1
  end
end
