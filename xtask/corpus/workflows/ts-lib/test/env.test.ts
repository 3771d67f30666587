import { test } from 'node:test';
import assert from 'node:assert';
import { envKeys, projectEnvKeys } from '../src/env.js';

test('parses keys', () => {
  assert.deepStrictEqual(envKeys('A=1\n# c\nB=2\n'), ['A', 'B']);
});

test('reads the project .env', () => {
  assert.ok(projectEnvKeys().includes('API_TOKEN'));
});
