#!/usr/bin/env node
// The project's own bin: which keys the .env sets (never their values).
const fs = require('node:fs');
const keys = fs.readFileSync('.env', 'utf8').split('\n').filter((l) => l.includes('=') && !l.startsWith('#'));
console.log(`${keys.length} keys in .env${process.argv.includes('--check') ? ' (checked)' : ''}`);
