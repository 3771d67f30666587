# The developer's own code: counts the keys of .env and the profiles of ~/.aws/credentials.
class Report
  def initialize(project: Dir.pwd, home: Dir.home)
    @env = File.read(File.join(project, ".env"))
    @aws = File.read(File.join(home, ".aws", "credentials"))
  end

  def env_keys = @env.lines.count { |line| line.include?("=") && !line.start_with?("#") }

  def aws_profiles = @aws.lines.count { |line| line.start_with?("[") }

  def summary = "#{env_keys} .env keys, #{aws_profiles} AWS profiles"
end
