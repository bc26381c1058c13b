"""The Python testcontainers recipe of docs/containers.md, run as printed:
its code block is this module's code (its fixture and test are collected by pytest)."""
from conftest import TAGS, recipe_block

RECIPE = recipe_block("<!-- container-recipe-python")
exec(compile(RECIPE, "docs/containers.md:container-recipe-python", "exec"))


def test_the_recipe_names_this_versions_images():
    # A version bump that leaves the page's tags behind fails here.
    assert TAGS["redis"] in RECIPE and TAGS["valkey"] in RECIPE, TAGS
