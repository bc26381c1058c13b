// The Node testcontainers recipe of docs/containers.md is recipe.test.js,
// as printed: this fails when the two drift apart, or when the page's image
// tags are not the crate's version.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

const root = new URL('../../../', import.meta.url);
const page = readFileSync(new URL('docs/containers.md', root), 'utf8');
const version = readFileSync(new URL('Cargo.toml', root), 'utf8')
  .match(/\[workspace\.package\][^[]*?\nversion = "([^"]+)"/)[1];

test('the recipe of docs/containers.md is recipe.test.js', () => {
  const m = page.match(/<!-- container-recipe-node[^\n]*\n```js\n([\s\S]*?)\n```\n/);
  assert.ok(m, 'docs/containers.md has no container-recipe-node block');
  assert.equal(m[1] + '\n', readFileSync(new URL('recipe.test.js', import.meta.url), 'utf8'));
  for (const server of ['redis', 'valkey']) assert.ok(m[1].includes(`redis-ratelimit:${version}-${server}`));
});
