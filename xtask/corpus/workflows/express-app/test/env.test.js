const test = require('node:test');
const assert = require('node:assert');
const { execFileSync } = require('node:child_process');

test('the bin reads the .env', () => {
  assert.match(execFileSync(process.execPath, ['bin/env.js']).toString(), /keys in .env/);
});

test('dotenv loads the token', () => {
  require('dotenv').config();
  assert.ok(process.env.API_TOKEN);
});
