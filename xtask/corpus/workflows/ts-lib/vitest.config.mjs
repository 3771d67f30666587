import { defineConfig } from 'vitest/config';

// vitest's own tests, beside the node --test ones that tsc builds.
export default defineConfig({ test: { include: ['spec/**/*.spec.ts'] } });
