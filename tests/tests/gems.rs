//! RubyGems and Bundler as managers: a gem built here from a gemspec the test writes, whose
//! native extension's `extconf.rb` reads the fake SSH key, installed offline by `gem install`
//! and by `bundle install` under `credwatch run` (Debian's ruby and bundler; `cargo xtask test`
//! installs them).

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use credwatch_e2e::{assert_field, detached, detached_pid, in_tree, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

/// extconf.rb's last word: a Makefile with nothing to build, so that RubyGems' `make` and
/// `make install` after it succeed and the install completes.
const MAKEFILE: &str = "File.write(\"Makefile\", \"all:\\n\\ninstall:\\n\\nclean:\\n\")\n";

/// Writes the gem `name` `version` with the extension `ext/<name>/extconf.rb` whose body is
/// `extconf` (then [`MAKEFILE`]), builds it with `gem build` and returns the `.gem` file.
fn build_gem(sandbox: &Sandbox, name: &str, version: &str, extconf: &str) -> PathBuf {
    build_gem_with(sandbox, name, version, &[("extconf.rb", &format!("{extconf}{MAKEFILE}"))])
}

/// [`build_gem`] with the extension's files `ext/<name>/<file>` given, extconf.rb among them.
fn build_gem_with(sandbox: &Sandbox, name: &str, version: &str, files: &[(&str, &str)]) -> PathBuf {
    let source = sandbox.work().join(format!("{name}-src"));
    let ext = source.join("ext").join(name);
    fs::create_dir_all(&ext).unwrap();
    for (file, text) in files {
        fs::write(ext.join(file), text).unwrap();
    }
    let listed: Vec<String> = files.iter().map(|(file, _)| format!("\"ext/{name}/{file}\"")).collect();
    let spec = format!(
        "Gem::Specification.new do |s|\n  s.name = {name:?}\n  s.version = {version:?}\n  s.summary = \"credwatch e2e\"\n  s.authors = [\"credwatch\"]\n  s.license = \"MIT\"\n  s.files = [{}]\n  s.extensions = [\"ext/{name}/extconf.rb\"]\nend\n",
        listed.join(", ")
    );
    fs::write(source.join(format!("{name}.gemspec")), spec).unwrap();
    sandbox.setup("gem build", sandbox.command("gem").arg("build").arg(format!("{name}.gemspec")).current_dir(&source));
    let gem = source.join(format!("{name}-{version}.gem"));
    assert!(gem.is_file(), "gem build left no {}", gem.display());
    gem
}

/// Reads the key the way a payload would, from the user's home.
const READ_KEY: &str = "File.read(File.join(Dir.home, \".ssh\", \"id_ed25519\"))\n";

/// `gem install --local --install-dir DIR GEM` under `credwatch run`: no index, no network,
/// nothing outside the sandbox.
fn gem_install(sandbox: &Sandbox, gem: &Path) -> (Run, PathBuf) {
    let install = sandbox.work().join("gems");
    let run = sandbox.run(
        &sandbox.work(),
        &[
            "gem",
            "install",
            "--local",
            "--no-document",
            "--install-dir",
            install.to_str().unwrap(),
            gem.to_str().unwrap(),
        ],
    );
    (run, install)
}

#[track_caller]
fn assert_names_the_gem(sandbox: &Sandbox, run: &Run, manager: &str) {
    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_field(&alert, "/rule/id", "ssh-private-keys", run);
    assert_field(&alert, "/package/manager", manager, run);
    assert_field(&alert, "/package/name", "keyhunt-ext", run);
    assert_field(&alert, "/package/version", "0.4.2", run);
    assert_field(&alert, "/package/lifecycle", "extconf", run);
    // The reader is the ruby that runs extconf.rb, in the unpacked gem's extension directory.
    let args = alert["process"]["args"].as_array().cloned().unwrap_or_default();
    assert!(args.iter().any(|a| a == "extconf.rb"), "not extconf.rb's process: {alert:#}\n{}", run.describe());
    let cwd = alert["process"]["working_directory"].as_str().unwrap_or_default();
    assert!(cwd.ends_with("/gems/keyhunt-ext-0.4.2/ext/keyhunt-ext"), "cwd {cwd:?}: {alert:#}");
    // The key's alert alone: the manager's own work raises nothing.
    assert_eq!(run.alerts().len(), 1, "{}", run.describe());
}

#[test]
fn gem_install_extconf_reading_an_ssh_key_is_reported_with_gem_version_and_step() {
    let sandbox = Sandbox::new();
    let gem = build_gem(&sandbox, "keyhunt-ext", "0.4.2", READ_KEY);
    let (run, install) = gem_install(&sandbox, &gem);
    assert_names_the_gem(&sandbox, &run, "gem");
    assert!(
        install.join("specifications/keyhunt-ext-0.4.2.gemspec").is_file(),
        "gem install did not complete\n{}",
        run.describe()
    );
}

/// An application whose Gemfile wants `gem` from its vendor/cache (`--local` installs from
/// there, offline; a `path:` gem is used in place: Bundler builds no extension for it), and
/// the BUNDLE_* variables that keep Bundler's files in the sandbox.
fn bundle_app(sandbox: &Sandbox, gem: &Path) -> (PathBuf, Vec<(&'static str, String)>) {
    let app = sandbox.work().join("app");
    fs::create_dir_all(app.join("vendor/cache")).unwrap();
    fs::copy(gem, app.join("vendor/cache").join(gem.file_name().unwrap())).unwrap();
    fs::write(app.join("Gemfile"), "source \"https://rubygems.org\"\ngem \"keyhunt-ext\"\n").unwrap();
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    let env = vec![
        ("BUNDLE_PATH", path(sandbox.work().join("bundle"))),
        ("BUNDLE_APP_CONFIG", path(app.join(".bundle"))),
        ("BUNDLE_USER_HOME", path(sandbox.home().join(".bundle"))),
        ("BUNDLE_SILENCE_ROOT_WARNING", "1".into()),
    ];
    (app, env)
}

#[test]
fn bundle_install_extconf_reading_an_ssh_key_is_reported_with_gem_version_and_step() {
    let sandbox = Sandbox::new();
    let gem = build_gem(&sandbox, "keyhunt-ext", "0.4.2", READ_KEY);
    let (app, env) = bundle_app(&sandbox, &gem);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = sandbox.run_with_env(&app, &["bundle", "install", "--local"], &env);
    assert_names_the_gem(&sandbox, &run, "bundler");
    assert!(app.join("Gemfile.lock").is_file(), "bundle install did not complete\n{}", run.describe());
}

/// The kernel roots these itself: `gem` (a `#!/usr/bin/env ruby` script), `ruby .../gem` (the
/// interpreter and its script) and `bundle`, started after `watch` and outside any tree.
#[test]
fn watch_roots_gem_ruby_gem_and_bundle_started_after_it() {
    let sandbox = Sandbox::new();
    let gem = build_gem(&sandbox, "keyhunt-ext", "0.4.2", READ_KEY);
    let (app, bundle_env) = bundle_app(&sandbox, &gem);
    let work = sandbox.work();
    let install = |dir: &str| {
        format!("install --local --no-document --install-dir {} {}", work.join(dir).display(), gem.display())
    };
    let go = [
        detached(&sandbox, &work, "gem", &[], &format!("exec gem {}", install("gems-a"))),
        detached(&sandbox, &work, "ruby", &[], &format!("exec ruby \"$(command -v gem)\" {}", install("gems-b"))),
        detached(&sandbox, &app, "bundle", &bundle_env, "exec bundle install --local"),
    ];
    let watch = sandbox.watch();
    go.iter().for_each(|go| go());
    let key = sandbox.credential(".ssh/id_ed25519");
    let trees = [
        (detached_pid(&work, "gem"), "gem"),
        (detached_pid(&work, "ruby"), "gem"),
        (detached_pid(&app, "bundle"), "bundler"),
    ];
    let alerts: Vec<Option<Value>> = trees
        .iter()
        .map(|(pid, _)| sandbox.wait_for(|a| a["file"]["path"] == key && in_tree(a, *pid), Duration::from_secs(60)))
        .collect();
    let run = watch.stop();
    run.assert_exit(0);
    for ((pid, manager), alert) in trees.iter().zip(alerts) {
        let alert = alert.unwrap_or_else(|| panic!("no alert in the {manager} tree of {pid}\n{}", run.describe()));
        assert_field(&alert, "/package/manager", manager, &run);
        assert_field(&alert, "/package/name", "keyhunt-ext", &run);
        assert_field(&alert, "/package/version", "0.4.2", &run);
        assert_field(&alert, "/package/lifecycle", "extconf", &run);
        assert_ne!(alert["process"]["pid"], *pid, "the manager itself was reported: {alert:#}");
    }
}

#[test]
fn a_gem_whose_extconf_touches_no_credential_raises_nothing() {
    let sandbox = Sandbox::new();
    // It runs, and leaves a mark where RubyGems unpacked it.
    let gem = build_gem(&sandbox, "quiet-ext", "1.0.0", "File.write(\"built.txt\", \"built by quiet-ext\\n\")\n");
    let (run, install) = gem_install(&sandbox, &gem);
    run.assert_exit(0);
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    let built = fs::read_to_string(install.join("gems/quiet-ext-1.0.0/ext/quiet-ext/built.txt"));
    assert_eq!(built.ok().as_deref(), Some("built by quiet-ext\n"), "extconf.rb did not run\n{}", run.describe());
}

/// A real C extension built the usual way: mkmf's checks (a header, a function, a library, and
/// `try_run`, which compiles a test program and runs it as ./conftest), `create_makefile`, then
/// gcc under RubyGems' `make`. Nothing in it is theft.
#[test]
fn a_c_extension_built_with_mkmf_raises_nothing() {
    let sandbox = Sandbox::new();
    let extconf = "require \"mkmf\"\nabort \"no stdio.h\" unless have_header(\"stdio.h\")\nhave_func(\"strlcpy\")\nhave_library(\"m\", \"cos\")\nabort \"try_run failed\" unless try_run(\"int main(void) { return 0; }\")\ncreate_makefile(\"cquiet/cquiet\")\n";
    let source = "#include <ruby.h>\nstatic VALUE hello(VALUE self) { return rb_str_new_cstr(\"hello\"); }\nvoid Init_cquiet(void) { rb_define_global_function(\"cquiet_hello\", hello, 0); }\n";
    let gem = build_gem_with(&sandbox, "cquiet", "2.0.1", &[("extconf.rb", extconf), ("cquiet.c", source)]);
    let (run, install) = gem_install(&sandbox, &gem);
    run.assert_exit(0);
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    // Not vacuous: extconf.rb aborts unless each check passed (try_run's ./conftest ran and
    // exited 0), and gcc compiled the extension.
    let built = install.join("gems/cquiet-2.0.1/lib/cquiet/cquiet.so");
    assert!(built.is_file(), "no {}\n{}", built.display(), run.describe());
}
