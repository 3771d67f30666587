Gem::Specification.new do |s|
  s.name = "dep"
  s.version = "1.0.0"
  s.summary = "control"
  s.authors = ["x"]
  s.files = ["ext/dep/extconf.rb"]
  s.extensions = ["ext/dep/extconf.rb"]
end
