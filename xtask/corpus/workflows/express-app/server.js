// The developer's server: its settings come from .env and the AWS SDK's credentials file.
require('dotenv').config();
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const express = require('express');

const app = express();
const aws = fs.readFileSync(path.join(os.homedir(), '.aws', 'credentials'), 'utf8');
app.get('/health', (_req, res) => res.json({ ok: true, token: Boolean(process.env.API_TOKEN), aws: aws.length > 0 }));

// On loopback only; with --once it answers its own request and stops (a smoke run).
const server = app.listen(0, '127.0.0.1', async () => {
  const { port } = server.address();
  console.log(`listening on 127.0.0.1:${port}`);
  if (process.argv.includes('--once')) {
    const response = await fetch(`http://127.0.0.1:${port}/health`);
    console.log(await response.text());
    server.close();
  }
});
