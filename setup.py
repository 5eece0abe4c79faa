from setuptools import find_packages, setup

setup(
    name="msccl-compile",
    version="0.1.0",
    description="Compiler for GPU collective-communication algorithms: "
    "time-expanded MILP/LP planning lowered to MSCCL XML",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["compiler", "compiler.*", "backends", "backends.*", "hw_profiles", "templates"]),
    package_data={"hw_profiles": ["*.json"], "templates": ["*.j2"]},
    install_requires=[
        "cvxpy>=1.5",
        "highspy>=1.7",
        "numpy>=1.24",
        "scipy>=1.10",
        "networkx>=3.0",
        "lxml>=4.9",
        "jinja2>=3.1",
        "jsonschema>=4.17",
    ],
    extras_require={
        # torch 2.13.0 is the build the project is tested with; the pin keeps
        # pip from pulling a multi-GB CUDA build on CPU machines.
        "torch": ["torch==2.13.0", "matplotlib>=3.7"],
        # `msccl-compile report` and `--report` draw their figures with matplotlib
        "report": ["matplotlib>=3.7"],
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "matplotlib>=3.7"],
    },
    entry_points={"console_scripts": ["msccl-compile=compiler.cli.main:main"]},
)
