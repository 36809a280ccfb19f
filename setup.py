"""setup.cfg holds the metadata; this adds the one file it cannot express: a .pth at site-packages' top.

``hvd_elastic_horovodrun.pth`` makes horovodrun load hvd-elastic's driver rules
(:mod:`hvd_elastic.horovodrun`).  A wheel carries it next to the packages; an
editable install does not (setuptools maps packages only), so
``scripts/bootstrap.sh`` copies it into the environment for a checkout.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "hvd_elastic_horovodrun.pth"


class BuildWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithPth})
