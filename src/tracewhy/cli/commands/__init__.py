"""The subcommands, in the order ``tracewhy --help`` lists them."""

from tracewhy.cli.base import Command
from tracewhy.cli.commands.blocks import BlocksCommand
from tracewhy.cli.commands.check import CheckCommand
from tracewhy.cli.commands.diagnose import DiagnoseCommand
from tracewhy.cli.commands.diff import DiffCommand
from tracewhy.cli.commands.export import ExportCommand
from tracewhy.cli.commands.gaps import GapsCommand
from tracewhy.cli.commands.info import InfoCommand
from tracewhy.cli.commands.kernels import KernelsCommand
from tracewhy.cli.commands.ops import OpsCommand
from tracewhy.cli.commands.overlap import OverlapCommand
from tracewhy.cli.commands.ranks import RanksCommand
from tracewhy.cli.commands.report import ReportCommand
from tracewhy.cli.commands.roofline import RooflineCommand
from tracewhy.cli.commands.steps import StepsCommand

COMMANDS: tuple[type[Command], ...] = (
    DiagnoseCommand,
    GapsCommand,
    InfoCommand,
    OpsCommand,
    KernelsCommand,
    StepsCommand,
    OverlapCommand,
    BlocksCommand,
    RanksCommand,
    RooflineCommand,
    DiffCommand,
    CheckCommand,
    ExportCommand,
    ReportCommand,
)
