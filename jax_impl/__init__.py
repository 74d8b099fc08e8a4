from common.interrupts import exit_on_ctrl_c_in_a_command
exit_on_ctrl_c_in_a_command()  # in a command of the project, Ctrl-C from here on is one line and exit 130
