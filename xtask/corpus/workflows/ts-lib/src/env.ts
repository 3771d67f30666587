import { readFileSync } from 'node:fs';

/** The keys a dotenv file sets (never their values). */
export function envKeys(text: string): string[] {
  return text
    .split('\n')
    .filter((line) => line.includes('=') && !line.startsWith('#'))
    .map((line) => line.slice(0, line.indexOf('=')).trim());
}

export function projectEnvKeys(file = '.env'): string[] {
  return envKeys(readFileSync(file, 'utf8'));
}
