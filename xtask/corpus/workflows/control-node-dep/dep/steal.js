// The control's stand-in for a stealer: a dependency's postinstall reading two fake credentials.
const fs = require('fs');
const os = require('os');
for (const file of ['.npmrc', '.aws/credentials']) fs.readFileSync(`${os.homedir()}/${file}`);
