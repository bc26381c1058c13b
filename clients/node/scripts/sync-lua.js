// Copy the project's Lua twins (../../lua/*.lua) into this package (lua/),
// which ships them: run after lua/ changes (npm run sync-lua). A test fails
// while the copies differ.
import { readdirSync, copyFileSync, rmSync } from 'node:fs';

const src = new URL('../../../lua/', import.meta.url);
const dst = new URL('../lua/', import.meta.url);
const want = readdirSync(src).filter((f) => f.endsWith('.lua') && f !== 'library.lua');
for (const f of readdirSync(dst)) if (f.endsWith('.lua') && !want.includes(f)) rmSync(new URL(f, dst));
for (const f of want) copyFileSync(new URL(f, src), new URL(f, dst));
console.log(`copied ${want.join(', ')}`);
