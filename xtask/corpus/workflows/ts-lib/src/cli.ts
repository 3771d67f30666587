#!/usr/bin/env node
import { projectEnvKeys } from './env.js';

console.log(`keys in .env: ${projectEnvKeys().join(', ')}`);
