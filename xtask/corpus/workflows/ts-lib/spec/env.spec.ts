import { expect, test } from 'vitest';
import { envKeys, projectEnvKeys } from '../src/env';

test('parses keys', () => {
  expect(envKeys('A=1\n# c\nB=2\n')).toEqual(['A', 'B']);
});

test('reads the project .env', () => {
  expect(projectEnvKeys()).toContain('API_TOKEN');
});
