# The control's stand-in for a stealer: a gem's extension build reading a fake credential.
File.read(File.join(Dir.home, ".aws", "credentials"))
File.write("Makefile", "all:\n\ninstall:\n\nclean:\n")
